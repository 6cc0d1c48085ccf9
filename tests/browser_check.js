/* browser_check.js - tests/browser_test.sh puts this at the end of a copy of
 * a `mixprec report` page and has headless Chromium load it: once the
 * browser has laid the page out, every chart (<svg data-chart=...>) must
 * have a title, data marks of its kind (a drawn line, heatmap cells, bars)
 * inside its frame, x and y axis labels with text and a legend or colour
 * scale, all drawn within the chart. The verdict goes into the DOM (a <pre
 * id="mp-check">, read back from --dump-dom), not to the console: the
 * console must stay silent. */
(function () {
    var out = [], failures = 0;
    function fail(msg) {
        out.push("FAIL " + msg);
        failures++;
    }
    /* r inside box, give or take a pixel; an empty r is not drawn at all */
    function inside(r, box) {
        return r.width > 0 || r.height > 0 ? r.left >= box.left - 1 && r.right <= box.right + 1 &&
                                                 r.top >= box.top - 1 && r.bottom <= box.bottom + 1
                                           : false;
    }
    function drawnInside(els, box) {
        var n = 0;
        for (var i = 0; i < els.length; i++)
            if (inside(els[i].getBoundingClientRect(), box)) n++;
        return n;
    }
    var charts = document.querySelectorAll("svg");
    var kinds = {line: 0, heatmap: 0, bars: 0};
    for (var i = 0; i < charts.length; i++) {
        var svg = charts[i], kind = svg.getAttribute("data-chart");
        var t = svg.querySelector("title");
        var name = "chart " + (i + 1) + " '" + (t ? t.textContent : "") + "'";
        var box = svg.getBoundingClientRect();
        if (!t || !t.textContent) fail(name + ": no title");
        if (!(kind in kinds)) {
            fail(name + ": unknown kind " + kind);
            continue;
        }
        kinds[kind]++;
        if (box.width < 100 || box.height < 100) fail(name + ": drawn " + box.width + "x" + box.height);
        ["xlabel", "ylabel"].forEach(function (cls) {
            var l = svg.querySelector("text." + cls);
            if (!l || !l.textContent.trim())
                fail(name + ": no " + cls);
            else if (!inside(l.getBoundingClientRect(), box))
                fail(name + ": its " + cls + " is drawn outside the chart");
        });
        var texts = svg.querySelectorAll("text");
        for (var k = 0; k < texts.length; k++)
            if (!inside(texts[k].getBoundingClientRect(), box))
                fail(name + ": text '" + texts[k].textContent + "' drawn outside the chart");
        var marks, legend;
        if (kind == "line") {
            /* a series only counts when it draws a line (two points or more) */
            var series = svg.querySelectorAll("path.series"), lines = 0;
            for (var k = 0; k < series.length; k++)
                if (series[k].getTotalLength() > 0 &&
                    inside(series[k].getBoundingClientRect(), box))
                    lines++;
            marks = lines;
            legend = svg.querySelectorAll("text.legend").length;
        } else if (kind == "heatmap") {
            marks = drawnInside(svg.querySelectorAll("rect.cell"), box);
            legend = drawnInside(svg.querySelectorAll("rect.scale"), box);
        } else {
            marks = drawnInside(svg.querySelectorAll("rect.bar"), box);
            legend = svg.querySelectorAll("text.legend").length;
        }
        if (!marks) fail(name + ": no data drawn");
        if (!legend) fail(name + ": no legend");
        out.push(name + ": " + kind + ", " + marks + " marks, " + legend + " legend items");
    }
    out.push("charts " + charts.length + " (line " + kinds.line + ", heatmap " + kinds.heatmap +
             ", bars " + kinds.bars + ")");
    out.push("height " + Math.ceil(document.documentElement.scrollHeight));
    out.push(failures ? "result FAIL (" + failures + ")" : "result ok");
    var pre = document.createElement("pre");
    pre.id = "mp-check";
    pre.textContent = "\n" + out.join("\n") + "\n";
    document.body.appendChild(pre);
})();
