/* plan.c - what build decides about the layers' outputs once the graph is
 * known: which outputs no backward reads in full (dropped, their sign
 * perhaps carried in a consumer's codes), and which relu activations fuse
 * into their producer. */
#include "nn/layer.h"

/* The first consumer of layer i when the compact form it keeps of i's
 * output can carry that output's sign (ops->sign_input), read without a
 * cast between (its compute dtype is the output's, so y > 0 is x > 0);
 * else -1. */
static int sign_consumer(const mp_model *m, int i)
{
    for (int k = i + 1; k < m->nlayers; k++) {
        const mp_layer *c = &m->layers[k];
        for (int j = 0; c->reachable && j < c->ninputs; j++)
            if (c->inputs[j] == i)
                return c->ops->sign_input && c->ops->sign_input(m, c, j) &&
                               c->policy.compute == m->layers[i].out_dtype
                           ? k
                           : -1;
    }
    return -1;
}

/* Which outputs no backward reads in full (layer.h, mp_output_use): the
 * layer's own backward reads at most their sign, and every consumer keeps
 * a compact form of its own. The model's output is always kept (the loss
 * reads it). A dropped output whose sign is read takes it from its first
 * consumer's codes when they can carry it, else keeps a bit mask. Runs
 * after the float8 plan, on which compact forms depend. */
void mp_plan_dropped_outputs(mp_model *m)
{
    for (int i = 0; i < m->nlayers; i++) {
        mp_layer *l = &m->layers[i];
        l->out_dropped = false;
        l->sign_from = -1;
        if (!l->reachable || !l->ops->backward || i == m->output || !l->ops->output_use ||
            l->ops->output_use(l) == MP_OUTPUT_READ)
            continue;
        bool ok = true, read = false;
        for (int k = i + 1; k < m->nlayers && ok; k++) {
            const mp_layer *c = &m->layers[k];
            for (int j = 0; c->reachable && j < c->ninputs && ok; j++) {
                if (c->inputs[j] != i) continue;
                read = true;
                ok = c->ops->compact_input && c->ops->compact_input(m, c, j);
            }
        }
        l->out_dropped = ok && read;
        if (l->out_dropped && l->ops->output_use(l) == MP_OUTPUT_SIGN)
            l->sign_from = sign_consumer(m, i);
    }
}

/* Relu fusion (mp_layer.relu_fused): a producer of a fusing kind whose
 * one consumer, once, is a relu in its dtype, neither being the model's
 * output or dropped. */
void mp_plan_relu_fusion(mp_model *m)
{
    for (int i = 0; i < m->nlayers; i++) m->layers[i].relu_fused = m->layers[i].relu_view = false;
    for (int i = 0; i < m->nlayers; i++) {
        mp_layer *a = &m->layers[i];
        if (!a->reachable || !a->ops->is_relu || !a->ops->is_relu(a) || a->ninputs != 1) continue;
        mp_layer *b = &m->layers[a->inputs[0]];
        if (!b->ops->fuses_relu || b->index == m->output || b->out_dropped || a->out_dropped ||
            b->out_dtype != a->out_dtype || a->policy.compute != a->out_dtype ||
            b->policy.compute != b->out_dtype)
            continue;
        int uses = 0;
        for (int k = 0; k < m->nlayers; k++)
            for (int j = 0; m->layers[k].reachable && j < m->layers[k].ninputs; j++)
                uses += m->layers[k].inputs[j] == b->index;
        if (uses != 1) continue;
        b->relu_fused = a->relu_view = true;
    }
}
