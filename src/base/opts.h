/*
 * kvr_opts: one declarative option table per program drives everything about its settings:
 * parsing from a config file, the environment and the command line (in that order, so a flag
 * beats the environment, which beats the file), validation (ranges, choices), --help (with each
 * option's default, read from the table's storage before parsing, so help cannot drift from the
 * truth) and --print-config (the values in force, as a config file). Each option writes straight
 * into the program's config struct, whose defaults are set once, beside the struct, before
 * parsing. Not thread-safe: call it at start-up.
 */
#ifndef KVR_OPTS_H
#define KVR_OPTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define KVR_OPT_STR_MAX 256 /* bytes of a KVR_OPT_STR value, NUL included */

enum kvr_opt_type {
    KVR_OPT_STR,    /* char[KVR_OPT_STR_MAX] */
    KVR_OPT_U32,    /* uint32_t */
    KVR_OPT_U64,    /* uint64_t */
    KVR_OPT_DOUBLE, /* double (finite) */
    KVR_OPT_BOOL,   /* bool: 1/0, true/false, yes/no, on/off; a bare --flag is true */
    KVR_OPT_MS,     /* uint64_t nanoseconds, written in milliseconds */
    KVR_OPT_SEC,    /* uint64_t nanoseconds, written in seconds */
    KVR_OPT_ENUM,   /* int: the index of the value in choices */
    KVR_OPT_GROUP,  /* const struct kvr_opt[nsub]: more options, as if listed here */
};

#define KVR_OPTS_MAX 128 /* options in one table, groups expanded */

struct kvr_opt {
    const char *name;           /* --name, and the config-file key */
    const char *env;            /* environment variable, or NULL */
    enum kvr_opt_type type;     /* */
    void *ptr;                  /* where the value goes (see the types) */
    const char *help;           /* one line */
    double min, max;            /* numbers: accepted range, inclusive; both 0: any; KVR_OPT_STR:
                                   its length in bytes */
    const char *const *choices; /* KVR_OPT_ENUM: the names, NULL-terminated */
    bool secret;                /* KVR_OPT_STR: shown as "(set)", never as its value */
    bool urls;                  /* KVR_OPT_STR: URLs, shown with kvr_url_redact */
    size_t nsub;                /* KVR_OPT_GROUP: the entries at ptr */
};

/* What kvr_opts_parse says. */
enum kvr_opts_result {
    KVR_OPTS_GO = 0,   /* run with the values in the table */
    KVR_OPTS_EXIT = 1, /* --help or --print-config was printed: exit 0 */
    KVR_OPTS_BAD = 2,  /* an error, already reported on stderr: exit 2 */
};

/*
 * Apply, in order: the config file (--config PATH, else $KVR_CONFIG: "name = value" lines, '#'
 * comments), the environment, then the command line (--name value, --name=value).
 * argv[0] is skipped (a program's name, or a subcommand's).
 */
enum kvr_opts_result kvr_opts_parse(const struct kvr_opt *opts, size_t n, int argc, char **argv,
                                    const char *program, const char *summary);

/* Every option's value as config-file lines ("name = value"). */
void kvr_opts_print(const struct kvr_opt *opts, size_t n, FILE *f);

/* The value of one option as text (what --print-config writes) into buf: "(set)" for a secret
 * that is set, nothing for a group. */
void kvr_opt_format(const struct kvr_opt *o, char *buf, size_t len);

/* urls (comma-separated) with each URL's password, or token, replaced by "***". */
void kvr_url_redact(const char *urls, char *out, size_t len);

#endif
