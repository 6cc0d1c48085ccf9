/* optimizer.c - SGD, Adam and AdamW on float32 master weights.
 *
 * Each parameter tensor is updated in one pass over L1-sized chunks: the
 * chunk's gradient is read once, moments and master are updated in float32,
 * and the low-precision copy of the same chunk is written while it is still
 * in cache. In pure low-precision mode (no master) the chunk is widened to
 * float32 first and rounded back afterwards, to nearest or stochastically.
 * On a diagnostic step the same pass also gathers each tensor's numerics
 * (mp_optimizer_collect_numerics): chunks still in cache, no update changed.
 * Sharded (mp_optimizer_shard, ZeRO stage 1), it keeps the slots of and
 * updates only its part [n r / N, n (r + 1) / N) of each tensor: every rule
 * is per element (and stochastic rounding keyed by element index), so the
 * parts are the bits the whole update gives. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <omp.h>

#include "core/profile.h"
#include "optim_internal.h"

/* Floats per chunk: gradient, master, two moments and the weight copy stay
 * well inside a 32 KiB L1. */
#define CHUNK MP_UPDATE_CHUNK

struct mp_optimizer {
    mp_optimizer_config cfg;
    int n_params;
    mp_param *params;
    char **names;
    int n_slots;
    float **slots;              /* [param * n_slots + slot] */
    int shard_rank, shard_size; /* size 1: whole tensors */
    int64_t step;
    /* the next step's figures, when asked (mp_optimizer_collect_numerics) */
    mp_numerics *num_weights, *num_grads;
    /* per parameter, NULL until one is set (mp_optimizer_set_update_hook) */
    mp_update_hook *hooks;
};

mp_optimizer_config mp_optimizer_config_default(mp_optimizer_kind kind)
{
    mp_optimizer_config c = {
        .kind = kind,
        .learning_rate = 0.01f,
        .momentum = 0.0f,
        .nesterov = false,
        .beta1 = 0.9f,
        .beta2 = 0.999f,
        .epsilon = 1e-8f,
        .weight_decay = 0.0f,
        .clip_norm = 0.0f,
        .clip_value = 0.0f,
        .schedule = mp_lr_schedule_default(),
        .rounding = MP_ROUND_NEAREST,
        .seed = 0,
    };
    if (kind == MP_OPTIMIZER_ADAM || kind == MP_OPTIMIZER_ADAMW) c.learning_rate = 1e-3f;
    if (kind == MP_OPTIMIZER_ADAMW) c.weight_decay = 0.01f;
    return c;
}

const char *mp_optimizer_kind_name(mp_optimizer_kind kind)
{
    switch (kind) {
    case MP_OPTIMIZER_SGD:
        return "sgd";
    case MP_OPTIMIZER_ADAM:
        return "adam";
    case MP_OPTIMIZER_ADAMW:
        return "adamw";
    }
    return "unknown";
}

static bool finite_nonneg(float x) { return isfinite(x) && x >= 0.0f; }

static mp_status validate_config(const mp_optimizer_config *c)
{
    if ((unsigned)c->kind > MP_OPTIMIZER_ADAMW)
        return mp_set_error(MP_ERR_INVALID, "optimizer: unknown kind %d", (int)c->kind);
    const char *k = mp_optimizer_kind_name(c->kind);
    if (!finite_nonneg(c->learning_rate))
        return mp_set_error(MP_ERR_INVALID, "%s: learning_rate %g must be finite and >= 0", k,
                            (double)c->learning_rate);
    if (!finite_nonneg(c->weight_decay))
        return mp_set_error(MP_ERR_INVALID, "%s: weight_decay %g must be finite and >= 0", k,
                            (double)c->weight_decay);
    if (c->kind == MP_OPTIMIZER_SGD) {
        if (!(c->momentum >= 0.0f && c->momentum < 1.0f))
            return mp_set_error(MP_ERR_INVALID, "sgd: momentum %g not in [0, 1)",
                                (double)c->momentum);
        if (c->nesterov && c->momentum == 0.0f)
            return mp_set_error(MP_ERR_INVALID, "sgd: nesterov needs momentum > 0");
    } else {
        if (!(c->beta1 >= 0.0f && c->beta1 < 1.0f) || !(c->beta2 >= 0.0f && c->beta2 < 1.0f))
            return mp_set_error(MP_ERR_INVALID, "%s: betas (%g, %g) must be in [0, 1)", k,
                                (double)c->beta1, (double)c->beta2);
        if (!(c->epsilon > 0.0f) || !isfinite(c->epsilon))
            return mp_set_error(MP_ERR_INVALID, "%s: epsilon %g must be finite and > 0", k,
                                (double)c->epsilon);
    }
    if (!finite_nonneg(c->clip_norm) || !finite_nonneg(c->clip_value))
        return mp_set_error(MP_ERR_INVALID, "%s: clip_norm/clip_value must be finite and >= 0", k);
    if (c->clip_norm > 0.0f && c->clip_value > 0.0f)
        return mp_set_error(MP_ERR_INVALID, "%s: set clip_norm or clip_value, not both", k);
    if ((unsigned)c->rounding > MP_ROUND_STOCHASTIC)
        return mp_set_error(MP_ERR_INVALID, "%s: unknown rounding %d", k, (int)c->rounding);
    mp_status st = mp_lr_schedule_validate(&c->schedule);
    return st;
}

mp_status mp_params_validate(const char *who, const mp_param *params, int n_params)
{
    if (n_params < 0 || (n_params > 0 && !params))
        return mp_set_error(MP_ERR_INVALID, "%s: bad parameter list (%d parameters)", who,
                            n_params);
    for (int i = 0; i < n_params; i++) {
        const mp_param *p = &params[i];
        const char *nm = p->name ? p->name : "(unnamed)";
        if (p->n < 0)
            return mp_set_error(MP_ERR_INVALID, "%s: parameter %d '%s' has length %lld", who, i, nm,
                                (long long)p->n);
        if ((unsigned)p->weight_dtype >= MP_DTYPE_COUNT)
            return mp_set_error(MP_ERR_INVALID, "%s: parameter %d '%s' has unknown dtype %d", who,
                                i, nm, (int)p->weight_dtype);
        if (p->n > 0 && !p->master && !p->weight)
            return mp_set_error(MP_ERR_INVALID,
                                "%s: parameter %d '%s' has neither master nor weight", who, i, nm);
        if (p->master && (void *)p->master == p->weight && p->weight_dtype != MP_F32)
            return mp_set_error(MP_ERR_INVALID,
                                "%s: parameter %d '%s': weight == master but weight_dtype is %s",
                                who, i, nm, mp_dtype_name(p->weight_dtype));
    }
    return MP_OK;
}

static int slots_for(const mp_optimizer_config *c)
{
    if (c->kind == MP_OPTIMIZER_SGD) return c->momentum > 0.0f ? 1 : 0;
    return 2;
}

mp_optimizer *mp_optimizer_new(const mp_optimizer_config *cfg, const mp_param *params, int n_params)
{
    if (!cfg) {
        mp_set_error(MP_ERR_INVALID, "mp_optimizer_new: config is NULL");
        return NULL;
    }
    if (validate_config(cfg) != MP_OK) return NULL;
    if (mp_params_validate(mp_optimizer_kind_name(cfg->kind), params, n_params) != MP_OK)
        return NULL;
    mp_optimizer *o = calloc(1, sizeof *o);
    if (!o) goto nomem;
    o->cfg = *cfg;
    o->n_params = n_params;
    o->n_slots = slots_for(cfg);
    o->shard_size = 1;
    size_t np = n_params > 0 ? (size_t)n_params : 1;
    o->params = calloc(np, sizeof *o->params);
    o->names = calloc(np, sizeof *o->names);
    o->slots = calloc(np * (size_t)(o->n_slots ? o->n_slots : 1), sizeof *o->slots);
    if (!o->params || !o->names || !o->slots) goto nomem;
    for (int i = 0; i < n_params; i++) {
        o->params[i] = params[i];
        const char *nm = params[i].name ? params[i].name : "";
        size_t len = strlen(nm) + 1;
        o->names[i] = malloc(len);
        if (!o->names[i]) goto nomem;
        memcpy(o->names[i], nm, len);
        o->params[i].name = o->names[i];
        for (int s = 0; s < o->n_slots; s++) {
            size_t bytes = (size_t)params[i].n * sizeof(float);
            float *buf = mp_alloc(bytes ? bytes : 1, MP_MEM_OPTIMIZER);
            if (!buf) {
                mp_optimizer_free(o);
                return NULL; /* mp_alloc set the message */
            }
            memset(buf, 0, bytes);
            o->slots[(size_t)i * (size_t)o->n_slots + (size_t)s] = buf;
        }
    }
    return o;
nomem:
    mp_optimizer_free(o);
    mp_set_error(MP_ERR_NOMEM, "mp_optimizer_new: out of memory");
    return NULL;
}

void mp_optimizer_free(mp_optimizer *o)
{
    if (!o) return;
    if (o->slots)
        for (size_t i = 0; i < (size_t)o->n_params * (size_t)o->n_slots; i++) mp_free(o->slots[i]);
    if (o->names)
        for (int i = 0; i < o->n_params; i++) free(o->names[i]);
    free(o->slots);
    free(o->hooks);
    free(o->names);
    free(o->params);
    free(o);
}

/* The gradient as the step reads it: times gfactor, clamped by clip_value. */
static inline float step_grad(const mp_step_coefs *c, float g)
{
    float gj = g * c->gfactor;
    if (c->clip_value > 0.0f) {
        if (gj > c->clip_value)
            gj = c->clip_value;
        else if (gj < -c->clip_value)
            gj = -c->clip_value;
    }
    return gj;
}

/* The per-element rules of the header, on one chunk of float32 values. */
void mp_update_sgd_scalar(const mp_step_coefs *c, float *w, const float *g, float *buf, int64_t n)
{
    for (int64_t j = 0; j < n; j++) {
        float gj = step_grad(c, g[j]);
        if (c->weight_decay != 0.0f) gj = gj + c->weight_decay * w[j];
        if (buf) {
            float b = c->momentum * buf[j] + gj;
            buf[j] = b;
            gj = c->nesterov ? gj + c->momentum * b : b;
        }
        w[j] = w[j] - c->lr * gj;
    }
}

void mp_update_adam_scalar(const mp_step_coefs *c, bool decoupled, float *w, const float *g,
                           float *m, float *v, int64_t n)
{
    for (int64_t j = 0; j < n; j++) {
        float gj = step_grad(c, g[j]);
        float wj = w[j];
        if (decoupled)
            wj = wj * c->decoupled_decay;
        else if (c->weight_decay != 0.0f)
            gj = gj + c->weight_decay * wj;
        float mj = c->beta1 * m[j] + c->one_minus_beta1 * gj;
        float vj = c->beta2 * v[j] + c->one_minus_beta2 * gj * gj;
        m[j] = mj;
        v[j] = vj;
        float denom = sqrtf(vj) / c->sqrt_bc2 + c->eps;
        w[j] = wj - c->step_size * (mj / denom);
    }
}

/* A fresh stochastic-rounding key per (seed, step, parameter): a repeated
 * key would round every step the same way and reintroduce the bias. */
static uint64_t rounding_seed(uint64_t seed, int64_t step, int index)
{
    return mp_mix64(seed ^ mp_mix64((uint64_t)step * 0x9E3779B97F4A7C15ull + (uint64_t)index + 1));
}

typedef struct {
    mp_sgd_kernel sgd;
    mp_adam_kernel adam;
} kernels;

static kernels kernels_for(mp_isa isa)
{
    kernels k;
    mp_update_kernels_for(isa, &k.sgd, &k.adam);
    return k;
}

/* Tensors below this many elements are updated by one thread: a parallel
 * region costs more than the work. */
#define PARALLEL_MIN (1 << 16)

void mp_optimizer_shard_range(const mp_optimizer *o, int index, int64_t *lo, int64_t *hi)
{
    int64_t n = o->params[index].n;
    *lo = n * o->shard_rank / o->shard_size;
    *hi = n * (o->shard_rank + 1) / o->shard_size;
}

/* Every slot re-made for the part of (rank, size), keeping the values the
 * new part shares with the old one (the rest zero). */
static mp_status reshard(mp_optimizer *o, int rank, int size)
{
    for (int i = 0; i < o->n_params; i++) {
        int64_t olo, ohi, lo, hi;
        mp_optimizer_shard_range(o, i, &olo, &ohi);
        int64_t n = o->params[i].n;
        lo = n * rank / size;
        hi = n * (rank + 1) / size;
        for (int s = 0; s < o->n_slots; s++) {
            float **slot = &o->slots[(size_t)i * (size_t)o->n_slots + (size_t)s];
            size_t bytes = (size_t)(hi - lo) * sizeof(float);
            float *buf = mp_alloc(bytes ? bytes : 1, MP_MEM_OPTIMIZER);
            if (!buf) return MP_ERR_NOMEM; /* mp_alloc set the message */
            memset(buf, 0, bytes);
            int64_t a = lo > olo ? lo : olo, b = hi < ohi ? hi : ohi;
            if (b > a) memcpy(buf + (a - lo), *slot + (a - olo), (size_t)(b - a) * sizeof(float));
            mp_free(*slot);
            *slot = buf;
        }
    }
    o->shard_rank = rank;
    o->shard_size = size;
    return MP_OK;
}

mp_status mp_optimizer_shard(mp_optimizer *o, int rank, int nranks)
{
    if (!o || nranks < 1 || rank < 0 || rank >= nranks)
        return mp_set_error(MP_ERR_INVALID, "optimizer: no shard %d of %d", rank, nranks);
    if (o->shard_size == nranks && o->shard_rank == rank) return MP_OK;
    return reshard(o, rank, nranks);
}

int mp_optimizer_shards(const mp_optimizer *o) { return o ? o->shard_size : 1; }

static void update_param(const mp_optimizer *o, int index, const mp_step_coefs *coefs, kernels k,
                         mp_numerics *wpart, mp_numerics *gpart)
{
    const mp_param *p = &o->params[index];
    if (!p->grad || p->n == 0) return;
    int64_t lo, hi; /* this shard's part (all of it unsharded) */
    mp_optimizer_shard_range(o, index, &lo, &hi);
    /* AdamW leaves biases, norms and embeddings undecayed (GPT recipes)
     * unless asked to decay everything */
    mp_step_coefs exempt = *coefs;
    exempt.decoupled_decay = 1.0f;
    const mp_step_coefs *c =
        p->decay_exempt && !o->cfg.decay_all && o->cfg.kind == MP_OPTIMIZER_ADAMW ? &exempt : coefs;
    const size_t ws = mp_dtype_size(p->weight_dtype);
    float *s0 = o->n_slots > 0 ? o->slots[(size_t)index * (size_t)o->n_slots] : NULL;
    float *s1 = o->n_slots > 1 ? o->slots[(size_t)index * (size_t)o->n_slots + 1] : NULL;
    const bool pure_lp = !p->master && p->weight_dtype != MP_F32;
    const bool write_copy = p->master && p->weight && p->weight != (void *)p->master;
    const bool adamw = o->cfg.kind == MP_OPTIMIZER_ADAMW, sgd = o->cfg.kind == MP_OPTIMIZER_SGD;
    const bool stochastic = o->cfg.rounding == MP_ROUND_STOCHASTIC;
    const uint64_t rseed = rounding_seed(o->cfg.seed, o->step, index);
    const int64_t nchunks = (hi - lo + CHUNK - 1) / CHUNK;
    const int nt = hi - lo >= PARALLEL_MIN ? mp_num_threads() : 1;
    /* numerics of a tensor with a master: the master before and after, its
     * copy, the gradient (one part per thread) */
    const bool numerics = wpart && p->master;
    const mp_numerics_target target =
        numerics ? mp_numerics_target_of(p->weight_dtype) : (mp_numerics_target){0, 0, 0, 0};
    const mp_update_hook hook = o->hooks && p->master ? o->hooks[index] : (mp_update_hook){0};

    /* Chunks are independent element ranges, and stochastic rounding is
     * keyed by element index: the result does not depend on the threads. */
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
    for (int64_t ci = 0; ci < nchunks; ci++) {
        float tmp[CHUNK], before[CHUNK];
        int64_t off = lo + ci * CHUNK;
        int64_t len = hi - off < CHUNK ? hi - off : CHUNK;
        char *wcopy = p->weight ? (char *)p->weight + (size_t)off * ws : NULL;
        float *w;
        if (p->master)
            w = p->master + off;
        else if (!pure_lp)
            w = (float *)p->weight + off;
        else {
            mp_convert(tmp, MP_F32, wcopy, p->weight_dtype, (size_t)len);
            w = tmp;
        }
        if (numerics) memcpy(before, w, (size_t)len * sizeof *w);
        if (sgd)
            k.sgd(c, w, p->grad + off, s0 ? s0 + (off - lo) : NULL, len);
        else
            k.adam(c, adamw, w, p->grad + off, s0 + (off - lo), s1 + (off - lo), len);
        if (hook.fn) hook.fn(hook.ctx, omp_get_thread_num(), w, off, len);
        if (write_copy)
            mp_convert(wcopy, p->weight_dtype, w, MP_F32, (size_t)len);
        else if (pure_lp) {
            if (stochastic)
                mp_convert_stochastic_at(wcopy, p->weight_dtype, w, (size_t)len, rseed,
                                         (uint64_t)off);
            else
                mp_convert(wcopy, p->weight_dtype, w, MP_F32, (size_t)len);
        }
        if (numerics) {
            const float *copy = w; /* no copy apart: the master is what the layer reads */
            if (write_copy) {
                mp_convert(tmp, MP_F32, wcopy, p->weight_dtype, (size_t)len);
                copy = tmp;
            }
            int t = omp_get_thread_num();
            mp_numerics_scan(&wpart[t], w, copy, before, len, &target);
            mp_numerics_scan(&gpart[t], p->grad + off, NULL, NULL, len, &target);
        }
    }
}

static void optimizer_step(mp_optimizer *o)
{
    const mp_optimizer_config *cfg = &o->cfg;
    mp_step_coefs c = {0};
    c.lr = mp_lr_schedule_at(&cfg->schedule, cfg->learning_rate, o->step);
    c.gfactor = 1.0f;
    if (cfg->clip_norm > 0.0f)
        c.gfactor = mp_clip_norm_factor(o->params, o->n_params, cfg->clip_norm, NULL);
    c.clip_value = cfg->clip_value;
    c.weight_decay = cfg->weight_decay;
    c.momentum = cfg->momentum;
    c.nesterov = cfg->nesterov;
    if (cfg->kind != MP_OPTIMIZER_SGD) {
        double t = (double)(o->step + 1);
        double bc1 = 1.0 - pow((double)cfg->beta1, t);
        double bc2 = 1.0 - pow((double)cfg->beta2, t);
        c.beta1 = cfg->beta1;
        c.beta2 = cfg->beta2;
        c.one_minus_beta1 = 1.0f - cfg->beta1;
        c.one_minus_beta2 = 1.0f - cfg->beta2;
        c.eps = cfg->epsilon;
        c.step_size = (float)((double)c.lr / bc1);
        c.sqrt_bc2 = (float)sqrt(bc2);
        c.decoupled_decay = 1.0f - c.lr * cfg->weight_decay;
    }
    const kernels k = kernels_for(mp_update_path(cfg->kind == MP_OPTIMIZER_SGD));
    mp_numerics *wpart = NULL, *gpart = NULL;
    int nt = mp_num_threads();
    if (o->num_weights) {
        wpart = calloc((size_t)nt * 2, sizeof *wpart);
        gpart = wpart ? wpart + nt : NULL;
    }
    for (int i = 0; i < o->n_params; i++) {
        update_param(o, i, &c, k, wpart, gpart);
        if (!wpart || !o->params[i].master || !o->params[i].grad) continue;
        /* the threads' parts in thread order */
        memset(&o->num_weights[i], 0, sizeof o->num_weights[i]);
        memset(&o->num_grads[i], 0, sizeof o->num_grads[i]);
        for (int t = 0; t < nt; t++) {
            mp_numerics_merge(&o->num_weights[i], &wpart[t]);
            mp_numerics_merge(&o->num_grads[i], &gpart[t]);
        }
        memset(wpart, 0, (size_t)nt * 2 * sizeof *wpart);
    }
    free(wpart);
    o->num_weights = o->num_grads = NULL;
    o->step++;
}

mp_status mp_optimizer_step(mp_optimizer *o)
{
    if (!o) return mp_set_error(MP_ERR_INVALID, "mp_optimizer_step: optimizer is NULL");
    double t0 = mp_prof_region_enter(MP_PROF_OPTIMIZER);
    optimizer_step(o);
    mp_prof_region_leave(t0);
    return MP_OK;
}

mp_status mp_optimizer_set_update_hook(mp_optimizer *o, int index, mp_update_hook hook)
{
    if (!o || index < 0 || index >= o->n_params)
        return mp_set_error(MP_ERR_INVALID, "optimizer: no parameter %d for an update hook", index);
    if (!o->hooks && !(o->hooks = calloc((size_t)o->n_params, sizeof *o->hooks)))
        return mp_set_error(MP_ERR_NOMEM, "optimizer: out of memory");
    o->hooks[index] = hook;
    return MP_OK;
}

void mp_optimizer_collect_numerics(mp_optimizer *o, mp_numerics *weights, mp_numerics *grads)
{
    if (!o) return;
    o->num_weights = weights && grads ? weights : NULL;
    o->num_grads = weights && grads ? grads : NULL;
}

void mp_optimizer_refresh_weights(mp_optimizer *o)
{
    if (!o) return;
    for (int i = 0; i < o->n_params; i++) {
        const mp_param *p = &o->params[i];
        if (p->master && p->weight && p->weight != (void *)p->master)
            mp_convert(p->weight, p->weight_dtype, p->master, MP_F32, (size_t)p->n);
    }
}

const mp_optimizer_config *mp_optimizer_get_config(const mp_optimizer *o)
{
    return o ? &o->cfg : NULL;
}

float mp_optimizer_learning_rate(const mp_optimizer *o)
{
    if (!o) return 0.0f;
    return mp_lr_schedule_at(&o->cfg.schedule, o->cfg.learning_rate, o->step);
}

mp_status mp_optimizer_set_learning_rate(mp_optimizer *o, float base_lr)
{
    if (!o) return mp_set_error(MP_ERR_INVALID, "mp_optimizer_set_learning_rate: NULL optimizer");
    if (!finite_nonneg(base_lr))
        return mp_set_error(MP_ERR_INVALID, "learning rate %g must be finite and >= 0",
                            (double)base_lr);
    o->cfg.learning_rate = base_lr;
    return MP_OK;
}

int64_t mp_optimizer_step_count(const mp_optimizer *o) { return o ? o->step : 0; }

mp_status mp_optimizer_set_step_count(mp_optimizer *o, int64_t steps)
{
    if (!o) return mp_set_error(MP_ERR_INVALID, "mp_optimizer_set_step_count: NULL optimizer");
    if (steps < 0)
        return mp_set_error(MP_ERR_INVALID, "optimizer step count %lld < 0", (long long)steps);
    o->step = steps;
    return MP_OK;
}

int mp_optimizer_num_params(const mp_optimizer *o) { return o ? o->n_params : 0; }

const mp_param *mp_optimizer_params(const mp_optimizer *o) { return o ? o->params : NULL; }

const mp_param *mp_optimizer_param(const mp_optimizer *o, int index)
{
    if (!o || index < 0 || index >= o->n_params) return NULL;
    return &o->params[index];
}

int mp_optimizer_num_slots(const mp_optimizer *o) { return o ? o->n_slots : 0; }

const char *mp_optimizer_slot_name(const mp_optimizer *o, int slot)
{
    if (!o || slot < 0 || slot >= o->n_slots) return NULL;
    if (o->cfg.kind == MP_OPTIMIZER_SGD) return "momentum_buffer";
    return slot == 0 ? "exp_avg" : "exp_avg_sq";
}

float *mp_optimizer_slot(mp_optimizer *o, int index, int slot, int64_t *n)
{
    if (!o || index < 0 || index >= o->n_params || slot < 0 || slot >= o->n_slots) {
        mp_set_error(MP_ERR_INVALID,
                     "optimizer state: no slot %d of parameter %d (%d slots, %d params)", slot,
                     index, o ? o->n_slots : 0, o ? o->n_params : 0);
        return NULL;
    }
    int64_t lo, hi;
    mp_optimizer_shard_range(o, index, &lo, &hi);
    if (n) *n = hi - lo;
    return o->slots[(size_t)index * (size_t)o->n_slots + (size_t)slot];
}
