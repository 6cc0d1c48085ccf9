/* schedule.c - learning-rate schedules as pure functions of the applied-step
 * count, so that restoring the step count restores the schedule and a step
 * skipped by the loss scaler cannot move it. */
#include <math.h>

#include "core/internal.h"

static const double PI = 3.14159265358979323846;

mp_lr_schedule mp_lr_schedule_default(void)
{
    return (mp_lr_schedule){
        .decay = MP_LR_CONSTANT,
        .warmup_steps = 0,
        .warmup_start_factor = 0.0f,
        .step_size = 1,
        .gamma = 1.0f,
        .decay_steps = 1,
        .final_lr = 0.0f,
    };
}

mp_status mp_lr_schedule_validate(const mp_lr_schedule *s)
{
    if (!s) return mp_set_error(MP_ERR_INVALID, "lr schedule: NULL");
    if (s->warmup_steps < 0)
        return mp_set_error(MP_ERR_INVALID, "lr schedule: warmup_steps %lld < 0",
                            (long long)s->warmup_steps);
    if (!(s->warmup_start_factor >= 0.0f && s->warmup_start_factor <= 1.0f))
        return mp_set_error(MP_ERR_INVALID, "lr schedule: warmup_start_factor %g not in [0, 1]",
                            (double)s->warmup_start_factor);
    switch (s->decay) {
    case MP_LR_CONSTANT:
        return MP_OK;
    case MP_LR_STEP_DECAY:
        if (s->step_size < 1)
            return mp_set_error(MP_ERR_INVALID, "lr schedule: step decay needs step_size >= 1");
        if (!(s->gamma >= 0.0f && isfinite(s->gamma)))
            return mp_set_error(MP_ERR_INVALID, "lr schedule: gamma %g must be finite and >= 0",
                                (double)s->gamma);
        return MP_OK;
    case MP_LR_COSINE:
        if (s->decay_steps < 1)
            return mp_set_error(MP_ERR_INVALID, "lr schedule: cosine needs decay_steps >= 1");
        if (!(s->final_lr >= 0.0f && isfinite(s->final_lr)))
            return mp_set_error(MP_ERR_INVALID, "lr schedule: final_lr %g must be finite and >= 0",
                                (double)s->final_lr);
        return MP_OK;
    }
    return mp_set_error(MP_ERR_INVALID, "lr schedule: unknown decay %d", (int)s->decay);
}

float mp_lr_schedule_at(const mp_lr_schedule *s, float base_lr, int64_t step)
{
    double base = base_lr;
    if (!s || step < 0) return base_lr;
    if (step < s->warmup_steps) {
        double f0 = s->warmup_start_factor;
        return (float)(base * (f0 + (1.0 - f0) * (double)(step + 1) / (double)s->warmup_steps));
    }
    int64_t t = step - s->warmup_steps;
    switch (s->decay) {
    case MP_LR_CONSTANT:
        break;
    case MP_LR_STEP_DECAY:
        if (s->step_size >= 1) return (float)(base * pow(s->gamma, (double)(t / s->step_size)));
        break;
    case MP_LR_COSINE:
        if (s->decay_steps >= 1) {
            double fin = s->final_lr;
            double p = t >= s->decay_steps ? 1.0 : (double)t / (double)s->decay_steps;
            return (float)(fin + (base - fin) * 0.5 * (1.0 + cos(PI * p)));
        }
        break;
    }
    return base_lr;
}
