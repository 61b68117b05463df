/* Oracles of the split backward (models/module.h: ax_backward_input and
 * ax_backward_weight), shared by the test_split_* programs. */
#ifndef AX_SPLIT_TESTUTIL_H
#define AX_SPLIT_TESTUTIL_H

#include "harness.h"

/* Checks module m (takes ownership) on the CPU, on two units u1 and u2
 * (borrowed input lists of the same shapes, run with dropout seeds 99 and
 * 100 and fixed random output gradients), against the fused backward
 * (ax_backward, one slot per unit, each unit's own gradient buffer):
 *  - halves equal fused: forward, input half, weight half on one slot give
 *    the fused backward's input and parameter gradients bit for bit, and
 *    the input half alone leaves the gradient buffer zero;
 *  - W later: F(u1) F(u2) B(u1) B(u2) W(u2) W(u1) on two slots of the one
 *    module, each unit with its own gradient buffer, give each unit's fused
 *    gradients bit for bit, and leave both slots empty. The weight halves
 *    run with a parameter buffer full of NaN (the built-in layers' weight
 *    halves read no parameter).
 * need_dx is passed to every backward. Fails the test on a mismatch,
 * naming the unit and the first differing gradient. */
void ax_test_split_matches_fused(ax_module *m, const ax_tlist *u1,
                                 const ax_tlist *u2, int need_dx);
/* The same in the given precision (ax_precision, models/module.h), the
 * net's and so every call's: in bf16 the output gradients of bf16 outputs
 * are f32 like the others', and tensors are compared by their bytes. */
void ax_test_split_matches_fused_prec(ax_module *m, const ax_tlist *u1,
                                      const ax_tlist *u2, int need_dx,
                                      int precision);

/* A copy of the CPU list `in` with every f32 entry whose bit is set in
 * `mask` scaled by a and shifted by b (other entries shared): a second
 * unit for ax_test_split_matches_fused. Release with ax_tlist_clear. */
ax_tlist ax_test_other_unit(const ax_tlist *in, unsigned mask, float a,
                            float b);

#endif
