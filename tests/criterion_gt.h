/*
 * Criterion's new assertions, with gt() made strict. Criterion 2.4.1 (Debian's) expands a tagged
 * gt(Tag, a, b) to !(a < b), which also holds when a == b (Snaipe/Criterion#473, fixed after
 * 2.4.1 by #487); every test includes this header instead of <criterion/new/assert.h>, so
 * gt(u64, x, y) means x > y as written. The redefinition applies at each use (macros expand
 * where they are used), and only to C: Criterion's C++ operators are right.
 */
#ifndef KVR_CRITERION_GT_H
#define KVR_CRITERION_GT_H

#include <criterion/new/assert.h>

#ifndef __cplusplus
#undef CRI_BINOP_T_GT
#define CRI_BINOP_T_GT(Tag, Actual, Ref) (CRI_BINOP_LT_TAG(Tag, , Ref, Actual))
#endif

#endif
