/* summary.c - looking into a model: per-layer information (the precision
 * plan: policy, dtypes, parameter and activation bytes), the Keras-like
 * summary with memory by category, and the model's read-only accessors. */
#include <stdio.h>
#include <string.h>

#include "nn/layer.h"
#include "nn/quant.h"

const char *mp_shape_str(int ndim, const int64_t *shape, char *buf, size_t len)
{
    size_t off = (size_t)snprintf(buf, len, "(None");
    for (int i = 0; i < ndim && off < len; i++)
        off += (size_t)snprintf(buf + off, len - off, ", %lld", (long long)shape[i]);
    if (off < len) snprintf(buf + off, len - off, ")");
    return buf;
}

int mp_model_num_layers(const mp_model *m) { return m->nlayers; }

/* Bytes of l's parameters: masters (and float32 state), compute copies. */
static size_t param_bytes(const mp_model *m, const mp_layer *l, int64_t *params, int64_t *state)
{
    size_t bytes = 0;
    *params = *state = 0;
    for (int j = 0; j < l->nparams; j++) {
        const param_slot *s = &m->params[l->param_first + j];
        *(s->p.trainable ? params : state) += s->p.n;
        if (s->float32_only || l->policy.variable == MP_F32) bytes += (size_t)s->p.n * 4;
        if (!s->float32_only && l->policy.compute != MP_F32)
            bytes += (size_t)s->p.n * mp_dtype_size(l->policy.compute);
    }
    return bytes;
}

mp_status mp_model_layer_info(const mp_model *m, int layer, int64_t batch, mp_layer_info *out)
{
    if (layer < 0 || layer >= m->nlayers)
        return mp_set_error(MP_ERR_INVALID, "model: no layer %d (model has %d)", layer, m->nlayers);
    const mp_layer *l = &m->layers[layer];
    memset(out, 0, sizeof *out);
    out->name = l->name;
    out->type = l->ops->class_name;
    out->policy = l->policy;
    out->policy_explicit = l->policy_explicit;
    out->ninputs = l->ninputs;
    out->inputs = l->inputs;
    out->output_dtype = l->out_dtype;
    out->ndim = l->ndim;
    memcpy(out->shape, l->shape, sizeof out->shape);
    out->param_bytes = param_bytes(m, l, &out->params, &out->state);
    out->float8 = l->fp8_active;
    out->mx = l->mx_active;
    for (int g = 0; l->fp8_active && g < mp_quant_gemms(l); g++) /* the kernels' float8 codes */
        out->param_bytes += m->fp8[l->fp8_first + g * MP_FLOAT8_ROLES + MP_FLOAT8_WEIGHT].codes_n;
    out->saved_bytes = l->reachable ? mp_layer_saved_bytes(m, l, batch) : 0;
    out->workspace_bytes =
        l->reachable ? mp_layer_grad_bytes(m, l, batch) + mp_layer_temp_bytes(m, l, batch) : 0;
    return MP_OK;
}

mp_status mp_model_memory_plan(const mp_model *m, int64_t batch, int optimizer_slots,
                               mp_memory_plan *out)
{
    memset(out, 0, sizeof *out);
    if (!m->built) return mp_set_error(MP_ERR_INVALID, "model: memory plan before mp_model_build");
    if (batch < 1 || optimizer_slots < 0)
        return mp_set_error(MP_ERR_INVALID, "model: memory plan for batch %lld, %d slots",
                            (long long)batch, optimizer_slots);
    for (int i = 0; i < m->nparams; i++) {
        const mp_model_param *p = &m->params[i].p;
        size_t n = (size_t)p->n;
        if (!p->trainable) {
            out->state += n * 4;
            continue;
        }
        if (p->master) out->master_weights += n * 4;
        if (p->weight != p->master) out->weights += n * mp_dtype_size(p->weight_dtype);
        out->gradients += n * 4;
        out->optimizer_state += n * 4 * (size_t)optimizer_slots;
    }
    out->weights += mp_float8_model_bytes(m); /* float8 kernels' codes */
    size_t tmp = 0;                           /* one layer's temporaries at a time */
    for (int i = 0; i < m->nlayers; i++) {
        const mp_layer *l = &m->layers[i];
        if (!l->reachable) continue;
        out->activations += mp_layer_saved_bytes(m, l, batch);
        out->workspace += mp_layer_grad_bytes(m, l, batch);
        size_t t = mp_layer_temp_bytes(m, l, batch);
        if (t > tmp) tmp = t;
    }
    out->workspace += tmp;
    out->total = out->master_weights + out->weights + out->state + out->gradients +
                 out->optimizer_state + out->activations + out->workspace;
    return MP_OK;
}

int64_t mp_model_batch_for_memory(const mp_model *m, size_t bytes, int optimizer_slots,
                                  int64_t limit_batch)
{
    /* the plan grows with the batch: bisect on it */
    mp_memory_plan p;
    int64_t lo = 0, hi = limit_batch;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo + 1) / 2;
        if (mp_model_memory_plan(m, mid, optimizer_slots, &p) == MP_OK && p.total <= bytes)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

static void human(size_t b, char *buf, size_t len)
{
    if (b >= (1u << 20))
        snprintf(buf, len, "%.2f MiB", (double)b / (1 << 20));
    else if (b >= 1024)
        snprintf(buf, len, "%.1f KiB", (double)b / 1024);
    else
        snprintf(buf, len, "%zu B", b);
}

/* "e4m3" for mxfp8_e4m3, "int8" for mxint8 */
static const char *mx_element(mp_mx_format f)
{
    const char *n = mp_mx_format_name(f), *u = strchr(n, '_');
    return u ? u + 1 : n + 2;
}

mp_status mp_model_summary(const mp_model *m, int64_t batch, FILE *out)
{
    if (!m->built) return mp_set_error(MP_ERR_INVALID, "model: summary before mp_model_build");
    if (batch < 1 || batch > m->max_batch)
        return mp_set_error(MP_ERR_INVALID, "model: summary batch %lld outside 1..%lld",
                            (long long)batch, (long long)m->max_batch);
    fprintf(out, "Model: %d layers, precision plan at batch %lld\n", m->nlayers, (long long)batch);
    const char *rule =
        "---------------------------------------------------------------------------------------"
        "-----------------------------\n";
    fprintf(out, "%s", rule);
    fprintf(out, "%-34s %-16s %10s  %-15s %-12s %-9s %12s %12s\n", "Layer (type)", "Output Shape",
            "Param #", "Policy", "Compute", "Output", "Param bytes", "Saved act.");
    fprintf(out, "%s", rule);
    int64_t total = 0, total_state = 0;
    for (int i = 0; i < m->nlayers; i++) {
        mp_layer_info in;
        mp_model_layer_info(m, i, batch, &in);
        const mp_layer *l = &m->layers[i];
        char label[80], shape[64];
        snprintf(label, sizeof label, "%s (%s)", l->name, l->ops->class_name);
        mp_shape_str(l->ndim, l->shape, shape, sizeof shape);
        /* a data source computes nothing: its "compute" is its data's dtype */
        mp_dtype compute = l->ninputs ? l->policy.compute : l->out_dtype;
        const char *cname = mp_dtype_name(compute);
        char mxname[32];
        mp_mx_params mx;
        if (l->fp8_active) /* GEMM inputs in float8 (the rest in the compute dtype) */
            cname = l->fp8_params.format == MP_FLOAT8_HYBRID ? "e4m3+e5m2" : "e4m3";
        if (mp_model_layer_mx(m, i, &mx)) { /* in MX: "mx:e2m3+e5m2" (forward+gradients) */
            snprintf(mxname, sizeof mxname, "mx:%s+%s", mx_element(mx.format),
                     mx_element(mx.grad_format));
            cname = mxname;
        }
        fprintf(out, "%-34s %-16s %10lld  %-15s %-12s %-9s %12zu %12zu\n", label, shape,
                (long long)(in.params + in.state), l->policy.name, cname,
                mp_dtype_name(l->out_dtype), in.param_bytes, in.saved_bytes);
        if (mp_layer_quantized(l) && l->ops->float8_gemms) { /* which of its GEMMs */
            fprintf(out, "    %s GEMMs:", cname);
            for (int g = 0; g < mp_quant_gemms(l); g++)
                fprintf(out, "%s %s", g ? "," : "", l->ops->float8_gemms[g]);
            fprintf(out, "; the rest in %s\n", mp_dtype_name(l->policy.compute));
        }
        total += in.params;
        total_state += in.state;
    }
    fprintf(out, "%s", rule);
    mp_memory_plan p;
    mp_model_memory_plan(m, batch, 0, &p);
    fprintf(out, "Total params: %lld\n", (long long)(total + total_state));
    fprintf(out, "Trainable params: %lld\n", (long long)total);
    fprintf(out, "Non-trainable params: %lld\n", (long long)total_state);
    fprintf(out, "Memory by category at batch %lld (optimizer state comes with compile):\n",
            (long long)batch);
    const struct {
        const char *name;
        size_t bytes;
        const char *what;
    } rows[] = {{"master_weights", p.master_weights, "float32"},
                {"weights", p.weights, "compute copies, float8 kernel codes"},
                {"state", p.state, "float32, non-trainable"},
                {"gradients", p.gradients, "float32"},
                {"activations", p.activations, "saved for backward"},
                {"workspace", p.workspace, "upper bound of the backward pass"}};
    for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
        char h[32];
        human(rows[r].bytes, h, sizeof h);
        if (rows[r].bytes || r != 2)
            fprintf(out, "  %-16s %14zu  (%s, %s)\n", rows[r].name, rows[r].bytes, h, rows[r].what);
    }
    return MP_OK;
}

/* ------------------------------------------------------- accessors */

size_t mp_model_activation_bytes(const mp_model *m) { return m->act ? mp_arena_used(m->act) : 0; }
size_t mp_model_workspace_bytes(const mp_model *m)
{
    return m->ws ? mp_arena_peak(m->ws) + mp_arena_peak(m->tmp) : 0;
}

const mp_tensor *mp_model_node_output(const mp_model *m, mp_node node)
{
    if (node < 0 || node >= m->nlayers || !m->layers[node].has_out) return NULL;
    return &m->layers[node].out;
}

const mp_tensor *mp_model_node_grad(const mp_model *m, mp_node node)
{
    /* a fused relu's producer holds the relu's gradient, not its own */
    if (node < 0 || node >= m->nlayers || !m->layers[node].has_grad || m->layers[node].relu_fused)
        return NULL;
    return &m->layers[node].grad;
}

uint64_t mp_model_seed(const mp_model *m) { return m->seed; }
mp_node mp_model_output(const mp_model *m) { return m->built ? m->output : -1; }
bool mp_model_is_built(const mp_model *m) { return m->built; }
int64_t mp_model_max_batch(const mp_model *m) { return m->max_batch; }
mp_policy mp_model_policy(const mp_model *m)
{
    return m->has_policy ? m->policy : mp_global_policy();
}

mp_dtype mp_model_compute_dtype(const mp_model *m)
{
    /* the dtype most of the work runs in: that of the first weight layer */
    for (int i = 0; i < m->nlayers; i++)
        if (m->layers[i].nparams) return m->layers[i].policy.compute;
    return MP_F32;
}

int mp_model_input_shape(const mp_model *m, int64_t *shape)
{
    if (m->input < 0) return 0;
    const mp_layer *l = &m->layers[m->input];
    memcpy(shape, l->shape, (size_t)l->ndim * sizeof(int64_t));
    return l->ndim;
}

mp_dtype mp_model_input_dtype(const mp_model *m)
{
    return m->input < 0 ? MP_F32 : m->layers[m->input].out_dtype;
}

int mp_model_output_shape(const mp_model *m, int64_t *shape)
{
    if (m->output < 0) return 0;
    const mp_layer *l = &m->layers[m->output];
    memcpy(shape, l->shape, (size_t)l->ndim * sizeof(int64_t));
    return l->ndim;
}
