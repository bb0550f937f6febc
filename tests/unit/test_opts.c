/*
 * The option table (src/base/opts): precedence (config file < environment < flag), validation
 * (ranges, choices, types), durations, --print-config and --help showing the defaults.
 */
#include <criterion/criterion.h>
#include "../criterion_gt.h"
#include <criterion/redirect.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "opts.h"

static const char *const colours[] = {"red", "green", "blue", NULL};

struct settings {
    char name[KVR_OPT_STR_MAX];
    uint32_t count;
    uint64_t wait_ns;
    double ratio;
    bool loud;
    int colour;
};

static struct settings s;
static struct kvr_opt table[6];
static char config_path[64];

static void setup(void)
{
    memset(&s, 0, sizeof s);
    strcpy(s.name, "default-name");
    s.count = 3;
    s.wait_ns = 1500000; /* 1.5 ms */
    s.ratio = 0.5;
    s.colour = 1;
    const struct kvr_opt t[6] = {
        {.name = "name", .env = "KVRT_NAME", .type = KVR_OPT_STR, .ptr = s.name, .help = "a name"},
        {.name = "count",
         .env = "KVRT_COUNT",
         .type = KVR_OPT_U32,
         .ptr = &s.count,
         .help = "a count",
         .min = 1,
         .max = 10},
        {.name = "wait-ms", .type = KVR_OPT_MS, .ptr = &s.wait_ns, .help = "a wait"},
        {.name = "ratio",
         .type = KVR_OPT_DOUBLE,
         .ptr = &s.ratio,
         .help = "a ratio",
         .min = 0,
         .max = 1},
        {.name = "loud", .env = "KVRT_LOUD", .type = KVR_OPT_BOOL, .ptr = &s.loud, .help = "loud"},
        {.name = "colour",
         .type = KVR_OPT_ENUM,
         .ptr = &s.colour,
         .help = "a colour",
         .choices = colours},
    };
    memcpy(table, t, sizeof t);
    unsetenv("KVRT_NAME");
    unsetenv("KVRT_COUNT");
    unsetenv("KVRT_LOUD");
    unsetenv("KVR_CONFIG");
    snprintf(config_path, sizeof config_path, "/tmp/kvr_opts_%d.conf", (int)getpid());
}

static void teardown(void)
{
    unlink(config_path);
}

TestSuite(opts, .init = setup, .fini = teardown);

static enum kvr_opts_result parse(int argc, char **argv)
{
    return kvr_opts_parse(table, 6, argc, argv, "t", "a test");
}

static void write_config(const char *text)
{
    FILE *f = fopen(config_path, "w");
    cr_assert(f != NULL);
    fputs(text, f);
    fclose(f);
}

Test(opts, defaults_stand_when_nothing_is_given)
{
    char *argv[] = {"t", NULL};
    cr_assert(eq(int, parse(1, argv), KVR_OPTS_GO));
    cr_assert(eq(str, s.name, "default-name"));
    cr_assert(eq(u32, s.count, 3));
}

Test(opts, a_flag_beats_the_environment_which_beats_the_file)
{
    write_config("# a comment\nname = from-file\ncount = 4\nloud = yes\nratio = 0.25\n");
    setenv("KVRT_NAME", "from-env", 1);
    setenv("KVRT_COUNT", "5", 1);
    char *argv[] = {"t", "--config", config_path, "--count", "6", NULL};
    cr_assert(eq(int, parse(5, argv), KVR_OPTS_GO));
    cr_assert(eq(u32, s.count, 6), "the flag wins");
    cr_assert(eq(str, s.name, "from-env"), "the environment beats the file");
    cr_assert(s.loud, "the file sets what nothing else does");
    cr_assert(eq(dbl, s.ratio, 0.25));
}

/* A '#' starts a comment at a line's start only (a value, a password, may hold one: it was cut
 * there, silently); a line too long is refused (its tail was read as a line of its own, so a
 * long comment could end in a setting); a number takes digits only (" -1", "\t-1" were read as
 * 2^64 - 1). */
Test(opts, config_lines_are_read_whole_or_refused, .init = setup)
{
    write_config("  # an indented comment\nname = s3cr#t9\n");
    char *argv[] = {"t", "--config", config_path, NULL};
    cr_assert(eq(int, parse(3, argv), KVR_OPTS_GO));
    cr_assert(eq(str, s.name, "s3cr#t9"));
    char long_line[1200];
    memset(long_line, 'x', sizeof long_line);
    memcpy(long_line, "# ", 2);
    snprintf(long_line + 1100, sizeof long_line - 1100, " count = 9\n");
    write_config(long_line);
    cr_assert(eq(int, parse(3, argv), KVR_OPTS_BAD));
    char *bad[] = {"t", "--count", "\t-1", NULL};
    cr_assert(eq(int, parse(3, bad), KVR_OPTS_BAD));
}

Test(opts, the_config_file_may_come_from_the_environment)
{
    write_config("count = 7\n");
    setenv("KVR_CONFIG", config_path, 1);
    char *argv[] = {"t", NULL};
    cr_assert(eq(int, parse(1, argv), KVR_OPTS_GO));
    cr_assert(eq(u32, s.count, 7));
}

Test(opts, values_out_of_range_or_of_the_wrong_type_are_refused, .init = setup)
{
    const char *bad[][2] = {{"--count", "11"},    {"--count", "0"},    {"--count", "-1"},
                            {"--count", "3x"},    {"--ratio", "1.5"},  {"--ratio", "nan"},
                            {"--colour", "pink"}, {"--wait-ms", "-2"}, {"--loud=maybe", NULL},
                            {"--nope", "1"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *argv[] = {"t", (char *)bad[i][0], (char *)bad[i][1], NULL};
        int argc = bad[i][1] ? 3 : 2;
        cr_assert(eq(int, parse(argc, argv), KVR_OPTS_BAD), "%s %s accepted", bad[i][0],
                  bad[i][1] ? bad[i][1] : "");
    }
    setenv("KVRT_COUNT", "99", 1);
    char *argv[] = {"t", NULL};
    cr_assert(eq(int, parse(1, argv), KVR_OPTS_BAD), "a bad environment value is refused");
    unsetenv("KVRT_COUNT");
    write_config("count = 2\nbogus = 1\n");
    char *argv2[] = {"t", "--config", config_path, NULL};
    cr_assert(eq(int, parse(3, argv2), KVR_OPTS_BAD), "an unknown key in the file is refused");
}

Test(opts, durations_enums_and_booleans_parse_as_written)
{
    char *argv[] = {"t", "--wait-ms", "2.5", "--colour", "blue", "--loud", "--name=x=y", NULL};
    cr_assert(eq(int, parse(7, argv), KVR_OPTS_GO));
    cr_assert(eq(u64, s.wait_ns, 2500000));
    cr_assert(eq(int, s.colour, 2));
    cr_assert(s.loud, "a bare boolean flag is true");
    cr_assert(eq(str, s.name, "x=y"));
}

Test(opts, print_config_shows_the_values_in_force, .init = setup)
{
    cr_redirect_stdout();
    char *argv[] = {"t", "--count", "9", "--print-config", NULL};
    cr_assert(eq(int, parse(4, argv), KVR_OPTS_EXIT));
    fflush(stdout);
    cr_assert_stdout_eq_str("name = default-name\ncount = 9\nwait-ms = 1.5\nratio = 0.5\n"
                            "loud = false\ncolour = green\n");
}

/* --print-config printed doubles and fractional durations to 6 digits: a request TTL of
 * 123456.7 s showed as 123457, a 0.1234567 ratio as 0.123457 (not the values in force, and a
 * config file made of it changed them). */
Test(opts, print_config_shows_values_exactly, .init = setup)
{
    cr_redirect_stdout();
    char *argv[] = {"t", "--ratio", "0.1234567", "--wait-ms", "1000.0001", "--print-config", NULL};
    cr_assert(eq(int, parse(6, argv), KVR_OPTS_EXIT));
    fflush(stdout);
    cr_assert_stdout_eq_str("name = default-name\ncount = 3\nwait-ms = 1000.0001\n"
                            "ratio = 0.1234567\nloud = false\ncolour = green\n");
}

/* A --config with no path after it was skipped: the program ran without its config file. */
Test(opts, a_config_flag_without_a_path_is_refused, .init = setup)
{
    char *argv[] = {"t", "--count", "4", "--config", NULL};
    cr_assert(eq(int, parse(4, argv), KVR_OPTS_BAD));
}

/* Only blanks may stand between a key and its '=': "count 9 = 5" set count to 5. */
Test(opts, a_config_key_with_more_after_it_is_refused, .init = setup)
{
    write_config("count 9 = 5\n");
    char *argv[] = {"t", "--config", config_path, NULL};
    cr_assert(eq(int, parse(3, argv), KVR_OPTS_BAD));
    cr_assert(eq(u32, s.count, 3));
    write_config("count\t= 5\n");
    cr_assert(eq(int, parse(3, argv), KVR_OPTS_GO));
    cr_assert(eq(u32, s.count, 5));
}

/* A NUL byte in a config line is refused: fgets and strlen stopped at it (the line cut short, its
 * tail past the long-line check), and a file of NULs (/dev/zero) was read forever. */
Test(opts, a_config_line_with_a_nul_byte_is_refused, .init = setup, .timeout = 10)
{
    FILE *f = fopen(config_path, "w");
    cr_assert(f != NULL);
    fwrite("count = 5\0\ncount = 6\n", 1, 22, f);
    fclose(f);
    char *argv[] = {"t", "--config", config_path, NULL};
    cr_assert(eq(int, parse(3, argv), KVR_OPTS_BAD));
    cr_assert(eq(u32, s.count, 3));
    char *zero[] = {"t", "--config", "/dev/zero", NULL};
    cr_assert(eq(int, parse(3, zero), KVR_OPTS_BAD));
}

Test(opts, help_shows_each_default, .init = setup)
{
    cr_redirect_stdout();
    char *argv[] = {"t", "--help", NULL};
    cr_assert(eq(int, parse(2, argv), KVR_OPTS_EXIT));
    fflush(stdout);
    FILE *out = cr_get_redirected_stdout();
    char text[4096] = "";
    size_t n = fread(text, 1, sizeof text - 1, out);
    text[n] = 0;
    cr_assert(strstr(text, "--count N") && strstr(text, "(1 to 10; default 3; env KVRT_COUNT)"),
              "%s", text);
    cr_assert(strstr(text, "--colour red|green|blue") && strstr(text, "(default green)"), "%s",
              text);
    cr_assert(strstr(text, "(default 1.5)") != NULL, "%s", text);
}

/* --- the shared NATS options (src/base/natscfg) ------------------------------------------- */

#include "natscfg.h"

/* Parse argv over a fresh kvr_nats_config; the result, --print-config's text in out. */
static enum kvr_opts_result nats_parse(struct kvr_nats_config *c, int argc, char **argv)
{
    struct kvr_opt t[KVR_NATS_OPTIONS];
    kvr_nats_config_default(c, KVR_LOG_INFO);
    size_t n = kvr_nats_config_options(c, t);
    return kvr_opts_parse(t, n, argc, argv, "t", "a test");
}

Test(natscfg, secrets_are_never_printed, .init = cr_redirect_stdout)
{
    static struct kvr_nats_config c;
    char *argv[] = {"t",
                    "--nats",
                    "nats://bob:pw1@h:1,tok2@h:2,nats://al:p@ss@h:3",
                    "--user",
                    "bob",
                    "--password",
                    "pw3",
                    "--token",
                    "tok4",
                    "--print-config"};
    cr_assert(eq(int, nats_parse(&c, 10, argv), KVR_OPTS_EXIT));
    cr_assert(eq(str, c.password, "pw3"));
    fflush(stdout);
    char out[4096] = "";
    FILE *f = cr_get_redirected_stdout();
    size_t len = fread(out, 1, sizeof out - 1, f);
    out[len] = 0;
    cr_expect(strstr(out, "password = (set)\n") != NULL, "%s", out);
    cr_expect(strstr(out, "token = (set)\n") != NULL, "%s", out);
    /* a password may hold '@' (nats.c splits at the last one): none of it shows */
    cr_expect(strstr(out, "nats = nats://bob:***@h:1,***@h:2,nats://al:***@h:3\n") != NULL, "%s",
              out);
    cr_expect(strstr(out, "pw") == NULL && strstr(out, "tok2") == NULL &&
                  strstr(out, "ss@") == NULL,
              "%s", out);
}

/* Malformed lists show no part of a secret either: a password holding a ',' (the list is split
 * at commas first: "pa" showed), an '@' before the scheme's "://" (shown whole). */
Test(natscfg, a_malformed_url_list_shows_no_part_of_a_password)
{
    char out[256];
    kvr_url_redact("nats://u:pa,ss@h:1", out, sizeof out);
    cr_expect(eq(str, out, "nats://u:***,***@h:1"));
    kvr_url_redact("u:p@h://x", out, sizeof out);
    cr_expect(eq(str, out, "u:***@h://x"));
    kvr_url_redact("nats://h:1,nats://bob:pw@h:2", out, sizeof out);
    cr_expect(eq(str, out, "nats://h:1,nats://bob:***@h:2"), "a host's port is no password");
    kvr_url_redact("nats://h:1,tok@h:2", out, sizeof out);
    cr_expect(eq(str, out, "nats://h:***,***@h:2"), "the safe side, when a list reads both ways");
}

/* A --nats value refused (over 255 bytes) was echoed with its passwords, from a flag, the
 * environment or a config file. */
Test(natscfg, a_refused_url_shows_no_password, .init = cr_redirect_stderr)
{
    static struct kvr_nats_config c;
    char urls[400] = "", path[64], line[440];
    while (strlen(urls) < 300)
        strcat(urls, "nats://bob:hunter2@h:1,");
    char *argv[] = {"t", "--nats", urls};
    cr_assert(eq(int, nats_parse(&c, 3, argv), KVR_OPTS_BAD));
    setenv("KVR_NATS", urls, 1);
    char *none[] = {"t"};
    cr_assert(eq(int, nats_parse(&c, 1, none), KVR_OPTS_BAD));
    unsetenv("KVR_NATS");
    snprintf(path, sizeof path, "/tmp/kvr_natscfg_%d.conf", (int)getpid());
    FILE *f = fopen(path, "w");
    cr_assert(f != NULL);
    snprintf(line, sizeof line, "nats = %s\n", urls);
    fputs(line, f);
    fclose(f);
    char *file[] = {"t", "--config", path};
    cr_assert(eq(int, nats_parse(&c, 3, file), KVR_OPTS_BAD));
    unlink(path);
    fflush(stderr);
    char err[4096] = "";
    size_t n = fread(err, 1, sizeof err - 1, cr_get_redirected_stderr());
    err[n] = 0;
    cr_expect(strstr(err, "hunter2") == NULL, "%s", err);
    cr_expect(strstr(err, "nats://bob:***@h:1") != NULL, "%s", err);
}

Test(natscfg, an_empty_nats_is_refused)
{
    static struct kvr_nats_config c;
    char *argv[] = {"t", "--nats", ""};
    cr_expect(eq(int, nats_parse(&c, 3, argv), KVR_OPTS_BAD));
    char why[200];
    strcpy(c.urls, " , ");
    cr_expect(eq(int, kvr_nats_config_check(&c, why, sizeof why), KVR_ERR_INVALID));
    cr_expect(strstr(why, "--nats") != NULL, "%s", why);
}

Test(natscfg, credentials_that_clash_are_refused)
{
    static struct kvr_nats_config c;
    char why[200];
    char *argv[] = {"t", "--token", "x", "--user", "u"};
    cr_assert(eq(int, nats_parse(&c, 5, argv), KVR_OPTS_GO));
    cr_expect(eq(int, kvr_nats_config_check(&c, why, sizeof why), KVR_ERR_INVALID));
    char *argv2[] = {"t", "--tls-cert", "c.pem"};
    cr_assert(eq(int, nats_parse(&c, 3, argv2), KVR_OPTS_GO));
    cr_expect(eq(int, kvr_nats_config_check(&c, why, sizeof why), KVR_ERR_INVALID));
}

Test(opts, inf_and_nan_are_refused)
{
    static double x = 1;
    const struct kvr_opt t[] = {
        {.name = "w", .type = KVR_OPT_DOUBLE, .ptr = &x, .help = "w", .min = 0, .max = 1e6}};
    const char *bad[] = {"inf", "-inf", "nan", "1e400", "infinity"};
    for (int i = 0; i < 5; i++) {
        char *argv[] = {"t", "--w", (char *)bad[i]};
        cr_expect(eq(int, kvr_opts_parse(t, 1, 3, argv, "t", "a test"), KVR_OPTS_BAD), "%s",
                  bad[i]);
        cr_expect(eq(dbl, x, 1.0), "%s changed the value", bad[i]);
    }
}
