/*
 * Checks that must hold after every test of a suite (nothing leaked into a table, no callback on
 * a wrong thread). Criterion 2.4.1 ignores what fails in a suite's .fini: a failed assertion, or
 * even a crash, there is printed and the test still passes. So such checks go in an `end`
 * function that the test itself runs last: KVR_TEST_END(suite, name, end) { body } is
 * Test(suite, name) { body; end(); }, the body an ordinary function (a `return` in it still
 * reaches end). A suite's .fini then only frees what a failed test left.
 */
#ifndef KVR_CRITERION_END_H
#define KVR_CRITERION_END_H

#include <criterion/criterion.h>

#define KVR_TEST_END(Suite, Name, End)                                                             \
    static void Suite##_##Name##_body(void);                                                       \
    Test(Suite, Name)                                                                              \
    {                                                                                              \
        Suite##_##Name##_body();                                                                   \
        End();                                                                                     \
    }                                                                                              \
    static void Suite##_##Name##_body(void)

#endif
