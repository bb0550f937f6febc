/*
 * kvr_opts implementation.
 */
#define _DEFAULT_SOURCE
#include "opts.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static bool in_range(const struct kvr_opt *o, double x)
{
    return (o->min == 0 && o->max == 0) || (x >= o->min && x <= o->max);
}

static bool parse_u64(const char *v, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (!*v || *end || errno || !isdigit((unsigned char)*v)) /* strtoull takes " -1" too */
        return false;
    *out = x;
    return true;
}

static bool parse_double(const char *v, double *out)
{
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (!*v || *end || errno || !isfinite(x))
        return false;
    *out = x;
    return true;
}

static bool parse_bool(const char *v, bool *out)
{
    static const char *const yes[] = {"1", "true", "yes", "on"}, *const no[] = {"0", "false", "no",
                                                                                "off"};
    for (int i = 0; i < 4; i++) {
        if (!strcmp(v, yes[i]) || !strcmp(v, no[i])) {
            *out = !strcmp(v, yes[i]);
            return true;
        }
    }
    return false;
}

/* A duration in unit ns per written unit; non-negative, decimals allowed. */
static bool set_duration(const struct kvr_opt *o, const char *v, double unit)
{
    double x;
    if (!parse_double(v, &x) || x < 0 || !in_range(o, x) || x * unit > (double)UINT64_MAX / 2)
        return false;
    *(uint64_t *)o->ptr = (uint64_t)llround(x * unit);
    return true;
}

static bool set_enum(const struct kvr_opt *o, const char *v)
{
    for (int i = 0; o->choices && o->choices[i]; i++) {
        if (!strcmp(v, o->choices[i])) {
            *(int *)o->ptr = i;
            return true;
        }
    }
    return false;
}

static bool set_opt(const struct kvr_opt *o, const char *v)
{
    uint64_t u;
    double d;
    switch (o->type) {
    case KVR_OPT_STR:
        if (strlen(v) >= KVR_OPT_STR_MAX || !in_range(o, (double)strlen(v)))
            return false;
        strcpy((char *)o->ptr, v);
        return true;
    case KVR_OPT_U32:
        if (!parse_u64(v, &u) || u > UINT32_MAX || !in_range(o, (double)u))
            return false;
        *(uint32_t *)o->ptr = (uint32_t)u;
        return true;
    case KVR_OPT_U64:
        if (!parse_u64(v, &u) || !in_range(o, (double)u))
            return false;
        *(uint64_t *)o->ptr = u;
        return true;
    case KVR_OPT_DOUBLE:
        if (!parse_double(v, &d) || !in_range(o, d))
            return false;
        *(double *)o->ptr = d;
        return true;
    case KVR_OPT_BOOL:
        return parse_bool(v, (bool *)o->ptr);
    case KVR_OPT_MS:
        return set_duration(o, v, 1e6);
    case KVR_OPT_SEC:
        return set_duration(o, v, 1e9);
    case KVR_OPT_ENUM:
        return set_enum(o, v);
    case KVR_OPT_GROUP:
        break;
    }
    return false;
}

/* ns in units of unit ns (a power of ten), exactly: "1.5", never rounded to 6 digits. */
static void format_duration(uint64_t ns, uint64_t unit, char *buf, size_t len)
{
    int digits = 0;
    for (uint64_t u = unit; u > 1; u /= 10)
        digits++;
    uint64_t frac = ns % unit;
    while (frac && frac % 10 == 0)
        frac /= 10, digits--;
    if (frac)
        snprintf(buf, len, "%" PRIu64 ".%0*" PRIu64, ns / unit, digits, frac);
    else
        snprintf(buf, len, "%" PRIu64, ns / unit);
}

/* The shortest of %.6g .. %.17g that reads back as x: the value in force, not a rounding. */
static void format_double(double x, char *buf, size_t len)
{
    for (int prec = 6; prec <= 17; prec++) {
        snprintf(buf, len, "%.*g", prec, x);
        if (strtod(buf, NULL) == x)
            return;
    }
}

/* Whether the URL list's next segment (after u[n], a ',') holds an '@' before any "://": the
 * tail of a password holding a ',' (the list is split at commas first). */
static bool password_goes_on(const char *u, size_t n)
{
    if (u[n] != ',')
        return false;
    const char *next = u + n + 1, *at = strchr(next, '@'), *scheme = strstr(next, "://");
    size_t len = strcspn(next, ",");
    return at && (size_t)(at - next) < len && (!scheme || scheme > at);
}

void kvr_url_redact(const char *urls, char *out, size_t len)
{
    size_t at = 0;
    for (const char *u = urls; *u && at + 1 < len;) {
        size_t n = strcspn(u, ","), host = 0;
        const char *scheme = strstr(u, "://"), *first = memchr(u, '@', n);
        size_t from = scheme && (size_t)(scheme - u) < n ? (size_t)(scheme - u) + 3 : 0;
        if (first && (size_t)(first - u) < from)
            from = 0; /* "u:p@h://x": the '@' before the scheme's mark is the secret's end */
        const char *atsign = NULL; /* the last '@': nats.c takes a password with '@' in it */
        for (size_t i = from; i < n; i++)
            if (u[i] == '@')
                atsign = u + i;
        bool cut = !atsign && password_goes_on(u, n); /* "nats://u:pa,ss@h": "pa" is secret */
        if (atsign || cut) { /* user:password@ or token@: keep the user, never the secret */
            size_t info = (atsign ? (size_t)(atsign - u) : n) - from;
            const char *colon = memchr(u + from, ':', info);
            size_t keep = colon ? (size_t)(colon - u) + 1 : from;
            at += (size_t)snprintf(out + at, len - at, "%.*s***", (int)keep, u);
            host = atsign ? (size_t)(atsign - u) : n;
        }
        if (at < len)
            at += (size_t)snprintf(out + at, len - at, "%.*s%s", (int)(n - host), u + host,
                                   u[n] ? "," : "");
        u += n + (u[n] == ',');
    }
    if (len)
        out[at < len ? at : len - 1] = 0;
}

void kvr_opt_format(const struct kvr_opt *o, char *buf, size_t len)
{
    switch (o->type) {
    case KVR_OPT_STR:
        if (o->secret) /* a password or a token: whether it is set, never what it is */
            snprintf(buf, len, "%s", *(const char *)o->ptr ? "(set)" : "");
        else if (o->urls)
            kvr_url_redact((const char *)o->ptr, buf, len);
        else
            snprintf(buf, len, "%s", (const char *)o->ptr);
        break;
    case KVR_OPT_U32:
        snprintf(buf, len, "%" PRIu32, *(const uint32_t *)o->ptr);
        break;
    case KVR_OPT_U64:
        snprintf(buf, len, "%" PRIu64, *(const uint64_t *)o->ptr);
        break;
    case KVR_OPT_DOUBLE:
        format_double(*(const double *)o->ptr, buf, len);
        break;
    case KVR_OPT_BOOL:
        snprintf(buf, len, "%s", *(const bool *)o->ptr ? "true" : "false");
        break;
    case KVR_OPT_MS:
        format_duration(*(const uint64_t *)o->ptr, 1000000ull, buf, len);
        break;
    case KVR_OPT_SEC:
        format_duration(*(const uint64_t *)o->ptr, 1000000000ull, buf, len);
        break;
    case KVR_OPT_ENUM:
        snprintf(buf, len, "%s", o->choices[*(const int *)o->ptr]);
        break;
    case KVR_OPT_GROUP:
        snprintf(buf, len, "%s", "");
        break;
    }
}

/* opts with every group expanded in place into flat (KVR_OPTS_MAX); the count. */
static size_t flatten(const struct kvr_opt *opts, size_t n, struct kvr_opt *flat, size_t at)
{
    for (size_t i = 0; i < n; i++) {
        if (opts[i].type == KVR_OPT_GROUP)
            at = flatten(opts[i].ptr, opts[i].nsub, flat, at);
        else if (at < KVR_OPTS_MAX)
            flat[at++] = opts[i];
    }
    return at;
}

/* What o accepts, for the message that refuses a value: "a finite number, 0 to 1e+06". */
static void accepted(const struct kvr_opt *o, char *buf, size_t len)
{
    static const char *const what[] = {"text",
                                       "a whole number",
                                       "a whole number",
                                       "a finite number",
                                       "true or false",
                                       "ms (>= 0)",
                                       "seconds (>= 0)",
                                       "one of ",
                                       ""};
    size_t at = (size_t)snprintf(buf, len, "%s", what[o->type]);
    for (int i = 0; o->type == KVR_OPT_ENUM && o->choices[i] && at < len; i++)
        at += (size_t)snprintf(buf + at, len - at, "%s%s", i ? "|" : "", o->choices[i]);
    if (at < len && o->type == KVR_OPT_STR)
        at += (size_t)snprintf(buf + at, len - at, " of %.0f to %d bytes", o->min ? o->min : 0,
                               o->max ? (int)o->max : KVR_OPT_STR_MAX - 1);
    else if (at < len && (o->min != 0 || o->max != 0))
        snprintf(buf + at, len - at, ", %.6g to %.6g", o->min, o->max);
}

static const struct kvr_opt *find_opt(const struct kvr_opt *opts, size_t n, const char *name,
                                      size_t len)
{
    for (size_t i = 0; i < n; i++)
        if (strlen(opts[i].name) == len && !strncmp(opts[i].name, name, len))
            return &opts[i];
    return NULL;
}

static void type_hint(const struct kvr_opt *o, char *buf, size_t len)
{
    static const char *const hints[] = {"TEXT", "N", "N", "X", "", "MS", "S", "", ""};
    size_t at = (size_t)snprintf(buf, len, "%s", hints[o->type]);
    for (int i = 0; o->type == KVR_OPT_ENUM && o->choices[i] && at < len; i++)
        at += (size_t)snprintf(buf + at, len - at, "%s%s", i ? "|" : "", o->choices[i]);
}

static void print_help(const struct kvr_opt *table, size_t ntable, const char *program,
                       const char *summary)
{
    struct kvr_opt opts[KVR_OPTS_MAX];
    size_t n = flatten(table, ntable, opts, 0);
    printf("usage: %s [options]\n%s\n\noptions (also as 'name = value' lines in a config file, "
           "or in the environment;\na flag beats the environment, which beats the file):\n",
           program, summary);
    printf("  %-32s a config file (env KVR_CONFIG)\n", "--config PATH");
    for (size_t i = 0; i < n; i++) {
        char left[256], hint[200], value[KVR_OPT_STR_MAX + 32];
        type_hint(&opts[i], hint, sizeof hint);
        snprintf(left, sizeof left, "--%s%s%s", opts[i].name, *hint ? " " : "", hint);
        kvr_opt_format(&opts[i], value, sizeof value);
        char range[80] = "";
        if (opts[i].type != KVR_OPT_STR && (opts[i].min != 0 || opts[i].max != 0))
            snprintf(range, sizeof range, "%.6g to %.6g; ", opts[i].min, opts[i].max);
        printf("  %-32s %s (%sdefault %s%s%s)\n", left, opts[i].help, range,
               *value ? value : "none", opts[i].env ? "; env " : "",
               opts[i].env ? opts[i].env : "");
    }
    printf("  %-32s print the settings in force as a config file, and exit\n", "--print-config");
    printf("  %-32s this text\n", "--help");
}

void kvr_opts_print(const struct kvr_opt *table, size_t ntable, FILE *f)
{
    struct kvr_opt opts[KVR_OPTS_MAX];
    size_t n = flatten(table, ntable, opts, 0);
    for (size_t i = 0; i < n; i++) {
        char value[KVR_OPT_STR_MAX + 32];
        kvr_opt_format(&opts[i], value, sizeof value);
        fprintf(f, "%s = %s\n", opts[i].name, value);
    }
}

/* A refused value v of o as it may be shown: a secret not at all, URLs with their passwords
 * redacted (a refused --nats was echoed with them). */
static const char *shown(const struct kvr_opt *o, const char *v, char *buf, size_t len)
{
    if (o->secret)
        return "...";
    if (!o->urls)
        return v;
    kvr_url_redact(v, buf, len);
    return buf;
}

/* "name: bad value 'v': takes ..." into why (a secret's value is not repeated). */
static void refusal(const struct kvr_opt *o, const char *v, char *why, size_t len)
{
    char what[200], safe[1024];
    accepted(o, what, sizeof what);
    snprintf(why, len, "%s: bad value '%.64s': takes %s", o->name, shown(o, v, safe, sizeof safe),
             what);
}

/* One config-file line (comments and blanks already stripped); false on an error, why filled. */
static bool config_line(const struct kvr_opt *opts, size_t n, char *p, char *why, size_t len)
{
    char *eq = strchr(p, '=');
    size_t klen = strcspn(p, " \t=");
    if (!eq || p + klen + strspn(p + klen, " \t") != eq) { /* "count 9 = 5" set count to 5 */
        snprintf(why, len, "not 'name = value'");
        return false;
    }
    char *v = eq + 1 + strspn(eq + 1, " \t");
    size_t vl = strlen(v);
    while (vl && (v[vl - 1] == ' ' || v[vl - 1] == '\t'))
        v[--vl] = 0;
    const struct kvr_opt *o = find_opt(opts, n, p, klen);
    if (!o) {
        snprintf(why, len, "%.*s: not an option (see --help)", (int)klen, p);
        return false;
    }
    if (set_opt(o, v))
        return true;
    refusal(o, v, why, len);
    return false;
}

/* One line of f into buf (cap bytes, NUL-terminated, its newline dropped): 1, or 0 at the end of
 * the file, -1 for a line over cap - 2 bytes (its tail would be read as a line of its own: a
 * comment's tail as a setting), -2 for a NUL byte in it (fgets and strlen stopped there: a line
 * cut short, and a file of NULs, /dev/zero, read forever). */
static int config_getline(FILE *f, char *buf, size_t cap)
{
    size_t n = 0;
    int c;
    while ((c = getc(f)) != EOF && c != '\n') {
        if (c == 0)
            return -2;
        if (n + 2 >= cap)
            return -1;
        buf[n++] = (char)c;
    }
    buf[n] = 0;
    return c == EOF && n == 0 ? 0 : 1;
}

static enum kvr_opts_result read_config(const struct kvr_opt *opts, size_t n, const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "cannot read config file %s: %s\n", path, strerror(errno));
        return KVR_OPTS_BAD;
    }
    char line[1024];
    int lineno = 0;
    enum kvr_opts_result rc = KVR_OPTS_GO;
    int got;
    while (rc == KVR_OPTS_GO && (got = config_getline(f, line, sizeof line)) != 0) {
        lineno++;
        if (got < 0) {
            if (got == -1)
                fprintf(stderr, "%s:%d: a line over %zu bytes\n", path, lineno, sizeof line - 2);
            else
                fprintf(stderr, "%s:%d: a NUL byte\n", path, lineno);
            rc = KVR_OPTS_BAD;
            break;
        }
        char *p = line + strspn(line, " \t");
        /* a '#' starts a comment at the start of a line only: a value may hold one (a password) */
        p[*p == '#' ? 0 : strcspn(p, "\r\n")] = 0;
        char why[400];
        if (*p && !config_line(opts, n, p, why, sizeof why)) {
            fprintf(stderr, "%s:%d: %s\n", path, lineno, why);
            rc = KVR_OPTS_BAD;
        }
    }
    fclose(f);
    return rc;
}

/* The command line's flags; *i is advanced past a flag's separate value. */
static enum kvr_opts_result apply_flag(const struct kvr_opt *opts, size_t n, int argc, char **argv,
                                       int *i, const char *program)
{
    const char *a = argv[*i];
    if (strncmp(a, "--", 2)) {
        fprintf(stderr, "%s: unexpected argument '%s' (see --help)\n", program, a);
        return KVR_OPTS_BAD;
    }
    const char *name = a + 2, *eq = strchr(name, '=');
    size_t len = eq ? (size_t)(eq - name) : strlen(name);
    const struct kvr_opt *o = find_opt(opts, n, name, len);
    if (!o) {
        fprintf(stderr, "%s: unknown option '%s' (see --help)\n", program, a);
        return KVR_OPTS_BAD;
    }
    const char *v = eq ? eq + 1 : NULL;
    if (!v && o->type == KVR_OPT_BOOL)
        v = "true";
    else if (!v && *i + 1 < argc)
        v = argv[++*i];
    if (!v || !set_opt(o, v)) {
        char what[200], safe[1024];
        accepted(o, what, sizeof what);
        fprintf(stderr, "%s: --%s %s%.64s\n", program, o->name,
                v ? "has a bad value: " : "needs a value", v ? shown(o, v, safe, sizeof safe) : "");
        fprintf(stderr, "%s: --%s takes %s\n", program, o->name, what);
        return KVR_OPTS_BAD;
    }
    return KVR_OPTS_GO;
}

/* The environment's values (after the file's, before the flags'). */
static enum kvr_opts_result apply_env(const struct kvr_opt *opts, size_t n, const char *program)
{
    for (size_t i = 0; i < n; i++) {
        const char *v = opts[i].env ? getenv(opts[i].env) : NULL;
        if (v && !set_opt(&opts[i], v)) {
            char why[400];
            refusal(&opts[i], v, why, sizeof why);
            fprintf(stderr, "%s: %s (from %s)\n", program, why, opts[i].env);
            return KVR_OPTS_BAD;
        }
    }
    return KVR_OPTS_GO;
}

enum kvr_opts_result kvr_opts_parse(const struct kvr_opt *table, size_t ntable, int argc,
                                    char **argv, const char *program, const char *summary)
{
    struct kvr_opt opts[KVR_OPTS_MAX];
    size_t n = flatten(table, ntable, opts, 0);
    const char *config = getenv("KVR_CONFIG");
    bool print = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            print_help(opts, n, program, summary);
            return KVR_OPTS_EXIT;
        }
        print |= !strcmp(argv[i], "--print-config");
        if (!strcmp(argv[i], "--config") && i + 1 < argc)
            config = argv[++i];
    }
    if (config && *config && read_config(opts, n, config) != KVR_OPTS_GO)
        return KVR_OPTS_BAD;
    if (apply_env(opts, n, program) != KVR_OPTS_GO)
        return KVR_OPTS_BAD;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--config")) {
            if (++i < argc)
                continue;
            fprintf(stderr, "%s: --config needs a value\n", program); /* was ignored */
            return KVR_OPTS_BAD;
        }
        if (!strcmp(argv[i], "--print-config"))
            continue;
        if (apply_flag(opts, n, argc, argv, &i, program) != KVR_OPTS_GO)
            return KVR_OPTS_BAD;
    }
    if (print) {
        kvr_opts_print(opts, n, stdout);
        return KVR_OPTS_EXIT;
    }
    return KVR_OPTS_GO;
}
