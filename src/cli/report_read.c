/* report_read.c - reading a run directory for `mixprec report`:
 * diagnostics.jsonl (JSON Lines: a malformed line is refused with its line
 * number and the rest kept; a truncated last line, as a killed run leaves,
 * is noted and skipped), history.csv and plan.json. Whatever is missing
 * becomes a note in the page. */
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "cli/report.h"

/* Epoch numbers beyond this are not read as epochs (nor cast to int). */
#define MAX_EPOCH 1e9

static const char *const mem_names[REPORT_MEM] = {
    "weights",     "master_weights", "gradients", "optimizer_state",
    "activations", "workspace",      "other"};

void report_note(report_run *r, FILE *err, const char *fmt, ...)
{
    char buf[320];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    r->partial = true;
    if (err) fprintf(err, "mixprec report: %s: %s\n", r->dir, buf);
    if (r->nnotes < 16) snprintf(r->notes[r->nnotes++], sizeof r->notes[0], "%s", buf);
}

static double num(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    return json_is_number(v) ? json_number_value(v) : NAN;
}

static void read_history(report_run *r, FILE *err)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/history.csv", r->dir);
    FILE *f = fopen(path, "r");
    if (!f) {
        report_note(r, err,
                    "no history.csv (a run killed before its end writes none): the "
                    "curves come from the diagnostics log's epoch records");
        return;
    }
    char line[1024];
    int lineno = 0;
    while (fgets(line, sizeof line, f)) {
        if (++lineno == 1) continue; /* the header */
        /* epoch,loss,accuracy,val_loss,val_accuracy,seconds,ms_per_step,loss_scale,skipped */
        double v[9];
        int k = 0;
        char *p = line;
        for (; k < 9; k++) {
            char *end;
            v[k] = strtod(p, &end);
            if (end == p) v[k] = NAN;
            p = strchr(end, ',');
            if (!p) break;
            p++;
        }
        if (k < 8 || !(fabs(v[0]) <= MAX_EPOCH)) { /* NaN, or no int */
            report_note(r, err, "history.csv line %d: malformed, skipped", lineno);
            continue;
        }
        report_epoch *e = realloc(r->epochs, (size_t)(r->nepochs + 1) * sizeof *e);
        if (!e) break;
        r->epochs = e;
        e[r->nepochs++] = (report_epoch){(int)v[0], v[1], v[2], v[3], v[4], v[6], v[7], NAN};
    }
    fclose(f);
    if (!r->nepochs) report_note(r, err, "history.csv holds no epochs");
}

static void add_step(report_run *r, json_t *rec, bool diag)
{
    report_step *s = realloc(r->steps, (size_t)(r->nsteps + 1) * sizeof *s);
    if (!s) return;
    r->steps = s;
    report_step *t = &s[r->nsteps++];
    memset(t, 0, sizeof *t);
    t->step = num(rec, "step");
    t->loss = num(rec, "loss");
    t->accuracy = num(rec, "accuracy");
    t->loss_scale = num(rec, "loss_scale");
    t->next_scale = num(rec, "next_loss_scale");
    t->grad_norm = num(rec, "grad_norm");
    t->lr = num(rec, "lr");
    t->step_ms = num(rec, "step_ms");
    t->skipped = json_is_true(json_object_get(rec, "skipped"));
    t->diag = diag;
    json_t *peak = json_object_get(json_object_get(rec, "memory"), "peak");
    for (int c = 0; c < REPORT_MEM; c++) t->mem_peak[c] = num(peak, mem_names[c]);
    t->layers = diag ? json_object_get(rec, "layers") : NULL;
}

/* An epoch record: the step where it ended, and the figures when
 * history.csv has none for it. */
static void add_epoch_record(report_run *r, json_t *rec, bool have_history)
{
    double epoch = num(rec, "epoch");
    if (!(fabs(epoch) <= MAX_EPOCH)) return; /* none, or no int */
    int ep = (int)epoch;
    for (int i = 0; i < r->nepochs; i++)
        if (r->epochs[i].epoch == ep) {
            r->epochs[i].step = num(rec, "step");
            return;
        }
    if (have_history) return;
    report_epoch *e = realloc(r->epochs, (size_t)(r->nepochs + 1) * sizeof *e);
    if (!e) return;
    r->epochs = e;
    e[r->nepochs++] = (report_epoch){ep,
                                     num(rec, "loss"),
                                     num(rec, "accuracy"),
                                     num(rec, "val_loss"),
                                     num(rec, "val_accuracy"),
                                     num(rec, "ms_per_step"),
                                     num(rec, "loss_scale"),
                                     num(rec, "step")};
}

static void read_log(report_run *r, FILE *err, bool have_history)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/diagnostics.jsonl", r->dir);
    FILE *f = fopen(path, "r");
    if (!f) {
        report_note(r, err, "no diagnostics.jsonl: no per-step figures");
        return;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int lineno = 0, good = 0;
    while ((len = getline(&line, &cap, f)) > 0) {
        lineno++;
        bool whole = line[len - 1] == '\n';
        json_error_t je;
        json_t *rec = json_loadb(line, (size_t)len, 0, &je);
        const char *type = json_string_value(json_object_get(rec, "type"));
        if (!rec || !json_is_object(rec) || !type) {
            if (!whole)
                report_note(r, err,
                            "diagnostics.jsonl line %d: truncated last line (the run was killed "
                            "while writing it?), skipped",
                            lineno);
            else
                report_note(r, err, "diagnostics.jsonl line %d: malformed (%s), skipped", lineno,
                            rec ? "not a record with a \"type\"" : je.text);
            json_decref(rec);
            continue;
        }
        good++;
        if (!strcmp(type, "run")) {
            snprintf(r->policy, sizeof r->policy, "%s",
                     json_string_value(json_object_get(rec, "policy"))
                         ? json_string_value(json_object_get(rec, "policy"))
                         : "?");
            snprintf(r->compute, sizeof r->compute, "%s",
                     json_string_value(json_object_get(rec, "compute_dtype"))
                         ? json_string_value(json_object_get(rec, "compute_dtype"))
                         : "?");
            json_decref(r->formats);
            r->formats = json_incref(json_object_get(rec, "formats"));
        } else if (!strcmp(type, "step")) {
            add_step(r, rec, true);
        } else if (!strcmp(type, "event")) {
            add_step(r, rec, false);
        } else if (!strcmp(type, "epoch")) {
            add_epoch_record(r, rec, have_history);
        }
        json_array_append_new(r->records, rec); /* step records point into it */
    }
    free(line);
    fclose(f);
    if (lineno == 0)
        report_note(r, err, "diagnostics.jsonl is empty");
    else if (!good)
        report_note(r, err, "diagnostics.jsonl: no readable line");
}

void report_run_read(report_run *r, const char *dir, FILE *err)
{
    memset(r, 0, sizeof *r);
    r->dir = dir;
    r->records = json_array();
    snprintf(r->policy, sizeof r->policy, "?");
    snprintf(r->compute, sizeof r->compute, "?");
    read_history(r, err);
    bool have_history = r->nepochs > 0;
    read_log(r, err, have_history);
    char path[4200];
    snprintf(path, sizeof path, "%s/plan.json", dir);
    json_error_t je;
    r->plan = json_load_file(path, 0, &je);
    if (!r->plan) report_note(r, err, "no readable plan.json (%s): no precision plan", je.text);
    if (!strcmp(r->policy, "?") && r->plan && json_string_value(json_object_get(r->plan, "policy")))
        snprintf(r->policy, sizeof r->policy, "%s",
                 json_string_value(json_object_get(r->plan, "policy")));
    const char *base = strrchr(dir, '/');
    base = base && base[1] ? base + 1 : dir;
    snprintf(r->label, sizeof r->label, "%s (%s)", base, r->policy);
}

void report_run_free(report_run *r)
{
    free(r->epochs);
    free(r->steps);
    json_decref(r->records);
    json_decref(r->formats);
    json_decref(r->plan);
}
