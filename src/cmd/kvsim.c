/*
 * kvsim: the offline tool of the routing core.
 *   kvsim hash    --block-size B --tokens 1,2,3,...   block hashes, to check against an engine
 *   kvsim explain [options]                           route a generated workload and say why
 * No NATS, no clock: everything runs in virtual time on the pure core.
 */
#include <errno.h>
#include <stdbool.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvr/hash.h"
#include "kvr/policy.h"
#include "kvr/rng.h"
#include "kvr/router.h"

static int usage(FILE *f)
{
    fprintf(f, "usage:\n"
               "  kvsim run --workload NAME --workers N --policies a,b,c\n"
               "            [--concurrency C | --rate-scale X] [--sweep v1,v2] --seed S --out DIR\n"
               "      simulate the workload through the router and N engines in virtual time;\n"
               "      writes DIR/report.json, DIR/report.md and plots (kvsim run --help)\n"
               "  kvsim hash --block-size B (--tokens T1,T2,... | --tokens-file PATH|-)\n"
               "      one line per full block: block index, local hash, sequence hash, each as\n"
               "      16 lower-case hex digits; a trailing partial block is not hashed\n"
               "  kvsim explain [--workers N] [--requests N] [--policy NAME] [--block-size B]\n"
               "                [--prefixes N] [--prefix-tokens N] [--unique-tokens N]\n"
               "                [--concurrency N] [--seed S] [--verbose N]\n"
               "      route a generated shared-prefix workload through the decision pipeline\n"
               "      and print each decision and the candidates' costs behind it\n"
               "policies:\n");
    for (int p = 0; p < KVR_POLICY_COUNT; p++)
        fprintf(f, "  %-20s %s\n", kvr_policy_name((enum kvr_policy)p),
                kvr_policy_desc((enum kvr_policy)p));
    return f == stderr ? 2 : 0;
}

static int parse_u64(const char *s, uint64_t max, uint64_t *out)
{
    if (!s || !*s || *s == '-' || *s == '+')
        return -1;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end || v > max)
        return -1;
    *out = v;
    return 0;
}

/* Parse token ids separated by commas or white space into a new array; the count, or -1. */
static long parse_tokens(const char *s, uint32_t **out)
{
    size_t cap = 64, n = 0;
    uint32_t *t = malloc(cap * sizeof *t);
    if (!t)
        return -1;
    const char *p = s;
    bool need = false; /* a separator was a comma: a number must follow */
    for (;;) {
        while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
            p++;
        if (!*p)
            break;
        char buf[16];
        size_t len = strspn(p, "0123456789");
        uint64_t v;
        if (len == 0 || len >= sizeof buf)
            goto bad;
        memcpy(buf, p, len);
        buf[len] = 0;
        if (parse_u64(buf, UINT32_MAX, &v))
            goto bad;
        if (n == cap) {
            uint32_t *nt = realloc(t, 2 * cap * sizeof *t);
            if (!nt)
                goto bad;
            t = nt;
            cap *= 2;
        }
        t[n++] = (uint32_t)v;
        p += len;
        while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
            p++;
        need = *p == ',';
        if (need)
            p++;
        else if (*p)
            goto bad;
    }
    if (need)
        goto bad;
    *out = t;
    return (long)n;
bad:
    free(t);
    return -1;
}

/* The whole of a file (or stdin for "-") as a string; NULL on error. */
static char *slurp(const char *path)
{
    FILE *f = strcmp(path, "-") ? fopen(path, "r") : stdin;
    if (!f)
        return NULL;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (n + 1 < cap)
            break;
        char *nb = realloc(buf, cap * 2);
        if (!nb) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = nb;
        cap *= 2;
    }
    if (buf)
        buf[n] = 0;
    if (f != stdin)
        fclose(f);
    return buf;
}

static int cmd_hash(int argc, char **argv)
{
    uint64_t bs = 0;
    const char *tokens = NULL, *file = NULL;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--block-size") && i + 1 < argc) {
            if (parse_u64(argv[++i], 1u << 20, &bs) || bs == 0) {
                fprintf(stderr, "kvsim hash: --block-size must be a positive integer\n");
                return 2;
            }
        } else if (!strcmp(argv[i], "--tokens") && i + 1 < argc) {
            tokens = argv[++i];
        } else if (!strcmp(argv[i], "--tokens-file") && i + 1 < argc) {
            file = argv[++i];
        } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            return usage(stdout);
        } else {
            fprintf(stderr, "kvsim hash: unknown argument '%s'\n", argv[i]);
            return usage(stderr);
        }
    }
    if (!bs || !(tokens || file) || (tokens && file)) {
        fprintf(stderr,
                "kvsim hash: --block-size and one of --tokens, --tokens-file are required\n");
        return 2;
    }
    char *text = NULL;
    if (file && !(text = slurp(file))) {
        fprintf(stderr, "kvsim hash: cannot read %s\n", file);
        return 2;
    }
    uint32_t *t = NULL;
    long n = parse_tokens(file ? text : tokens, &t);
    free(text);
    if (n < 0) {
        fprintf(stderr, "kvsim hash: tokens must be integers in [0, 2^32) separated by commas\n");
        return 2;
    }
    size_t nb = (size_t)n / bs;
    uint64_t *local = malloc((nb + 1) * sizeof *local), *seq = malloc((nb + 1) * sizeof *seq);
    if (!local || !seq) {
        fprintf(stderr, "kvsim hash: out of memory\n");
        free(t);
        free(local);
        free(seq);
        return 1;
    }
    kvr_hash_prompt(t, (size_t)n, bs, local, seq);
    for (size_t i = 0; i < nb; i++)
        printf("%016zx %016" PRIx64 " %016" PRIx64 "\n", i, local[i], seq[i]);
    free(t);
    free(local);
    free(seq);
    return 0;
}

int kvsim_explain(int argc, char **argv);
int kvsim_run(int argc, char **argv);

int main(int argc, char **argv)
{
    if (argc < 2)
        return usage(stderr);
    if (!strcmp(argv[1], "hash"))
        return cmd_hash(argc - 2, argv + 2);
    if (!strcmp(argv[1], "explain"))
        return kvsim_explain(argc - 2, argv + 2);
    if (!strcmp(argv[1], "run"))
        return kvsim_run(argc - 2, argv + 2);
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help"))
        return usage(stdout);
    fprintf(stderr, "kvsim: unknown command '%s'\n", argv[1]);
    return usage(stderr);
}
