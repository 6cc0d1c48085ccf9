/* mixprec/optim.h - optimizers on float32 master weights, learning-rate
 * schedules, gradient clipping and loss scaling. Included by mixprec.h. */
#ifndef MIXPREC_OPTIM_H
#define MIXPREC_OPTIM_H

#ifdef __cplusplus
extern "C" {
#endif

#ifdef __cplusplus
}
#endif
#endif
