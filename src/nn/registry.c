/* registry.c - the layer kinds this build knows: a new kind is its file
 * under layers/ and one entry in the list below. The config loader finds a
 * kind by its Keras class name here. */
#include <string.h>

#include "nn/layer.h"

#define MP_LAYER_KINDS(X)                                                                          \
    X(input)                                                                                       \
    X(dense)                                                                                       \
    X(activation)                                                                                  \
    X(dropout)                                                                                     \
    X(flatten)                                                                                     \
    X(reshape)                                                                                     \
    X(add)                                                                                         \
    X(layer_norm)                                                                                  \
    X(batch_norm)                                                                                  \
    X(embedding)                                                                                   \
    X(conv2d)                                                                                      \
    X(depthwise_conv2d)                                                                            \
    X(max_pooling2d)                                                                               \
    X(average_pooling2d)                                                                           \
    X(global_average_pooling2d)                                                                    \
    X(zero_padding2d)                                                                              \
    X(random_flip)                                                                                 \
    X(random_translation)                                                                          \
    X(multi_head_attention)                                                                        \
    X(position_embedding)                                                                          \
    X(reversible_embedding)

#define DECLARE(kind) extern const mp_layer_ops mp_##kind##_ops;
MP_LAYER_KINDS(DECLARE)
#define ENTRY(kind) &mp_##kind##_ops,
static const mp_layer_ops *const kinds[] = {MP_LAYER_KINDS(ENTRY)};

static int count(void) { return (int)(sizeof kinds / sizeof kinds[0]); }

const mp_layer_ops *mp_layer_ops_find(const char *class_name)
{
    for (int i = 0; class_name && i < count(); i++)
        if (!strcmp(kinds[i]->class_name, class_name)) return kinds[i];
    return NULL;
}
