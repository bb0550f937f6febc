/*
 * kvsim hash. Options come from one kvr_opts table; --tokens is the exception that takes a value
 * of any length (a table string holds KVR_OPT_STR_MAX - 1 bytes, a few dozen token ids): its
 * command-line value is taken from argv before the table sees the rest, and the table's entry
 * documents it and reads it from a config file. Token lists grow with kvr_grow.
 */
#include "cli_hash.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grow.h"
#include "kvr/hash.h"
#include "opts.h"

struct hash_config {
    uint32_t block_size;               /* tokens per block; 0: not given */
    char tokens[KVR_OPT_STR_MAX];      /* token ids (config file; the flag is taken apart) */
    char tokens_file[KVR_OPT_STR_MAX]; /* a file of token ids, "-" for stdin */
};

static bool is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* One token id at *p (decimal, below 2^32); *p is moved past it. */
static bool parse_token(const char **p, uint32_t *out)
{
    size_t len = strspn(*p, "0123456789");
    if (len == 0 || len > 15)
        return false;
    uint64_t v = 0;
    for (size_t i = 0; i < len; i++)
        v = v * 10 + (uint64_t)((*p)[i] - '0');
    if (v > UINT32_MAX)
        return false;
    *out = (uint32_t)v;
    *p += len;
    return true;
}

/* Token ids separated by commas or white space into a new array *out; the count, or -1. */
static long parse_tokens(const char *s, uint32_t **out)
{
    uint32_t *t = NULL, n = 0, cap = 0;
    const char *p = s;
    bool need = false; /* a separator was a comma: a number must follow */
    for (;;) {
        while (is_space(*p))
            p++;
        if (!*p)
            break;
        uint32_t v;
        if (n == UINT32_MAX || !parse_token(&p, &v) || !KVR_GROW(t, cap, n + 1, 64))
            goto bad;
        t[n++] = v;
        while (is_space(*p))
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
    char *buf = NULL;
    uint32_t n = 0, cap = 0;
    bool ok = true;
    for (;;) {
        if (n >= UINT32_MAX - 1 || !KVR_GROW(buf, cap, n + 2, 4096)) {
            ok = false;
            break;
        }
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += (uint32_t)got;
        if (got == 0) {
            ok = !ferror(f);
            break;
        }
    }
    if (f != stdin)
        fclose(f);
    if (!ok) {
        free(buf);
        return NULL;
    }
    buf[n] = 0;
    return buf;
}

/*
 * argv without --tokens and its value into args (room for argc + 1); the value into *tokens
 * (borrowed from argv), NULL when not given. A --tokens with no value is left for the table.
 */
static int take_tokens(int argc, char **argv, char **args, const char **tokens)
{
    int n = 0;
    *tokens = NULL;
    for (int i = 0; i < argc; i++) {
        if (!strncmp(argv[i], "--tokens=", 9))
            *tokens = argv[i] + 9;
        else if (!strcmp(argv[i], "--tokens") && i + 1 < argc)
            *tokens = argv[++i];
        else
            args[n++] = argv[i];
    }
    args[n] = NULL;
    return n;
}

static enum kvr_opts_result parse_options(struct hash_config *c, int argc, char **argv)
{
    const struct kvr_opt table[] = {
        {.name = "block-size",
         .type = KVR_OPT_U32,
         .ptr = &c->block_size,
         .help = "tokens per block, 1 to 2^20 (required)",
         .min = 0,
         .max = 1u << 20},
        {.name = "tokens",
         .type = KVR_OPT_STR,
         .ptr = c->tokens,
         .help = "token ids, comma-separated (this or --tokens-file)"},
        {.name = "tokens-file",
         .type = KVR_OPT_STR,
         .ptr = c->tokens_file,
         .help = "read the token ids from this file ('-': stdin), commas or white space between"},
    };
    return kvr_opts_parse(
        table, sizeof table / sizeof table[0], argc, argv, "kvsim hash",
        "One line per full block: block index, local hash, sequence hash, each as "
        "16 lower-case hex digits;\na trailing partial block is not hashed.");
}

/* Hash t[0..n) in blocks of bs and print one line per full block; the exit status. */
static int print_hashes(const uint32_t *t, size_t n, uint32_t bs)
{
    size_t nb = n / bs;
    uint64_t *local = malloc((nb + 1) * sizeof *local), *seq = malloc((nb + 1) * sizeof *seq);
    if (!local || !seq) {
        fprintf(stderr, "kvsim hash: out of memory\n");
        free(local);
        free(seq);
        return 1;
    }
    kvr_hash_prompt(t, n, bs, local, seq);
    for (size_t i = 0; i < nb; i++)
        printf("%016zx %016" PRIx64 " %016" PRIx64 "\n", i, local[i], seq[i]);
    free(local);
    free(seq);
    return 0;
}

int kvr_cli_hash_main(int argc, char **argv)
{
    struct hash_config c = {0};
    char **args = malloc(((size_t)argc + 1) * sizeof *args);
    if (!args)
        return 1;
    const char *flag_tokens;
    int nargs = take_tokens(argc, argv, args, &flag_tokens);
    enum kvr_opts_result r = parse_options(&c, nargs, args);
    free(args);
    if (r != KVR_OPTS_GO)
        return r == KVR_OPTS_EXIT ? 0 : 2;
    const char *tokens = flag_tokens ? flag_tokens : c.tokens[0] ? c.tokens : NULL;
    const char *file = c.tokens_file[0] ? c.tokens_file : NULL;
    if (!c.block_size || !(tokens || file) || (tokens && file)) {
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
    int rc = print_hashes(t, (size_t)n, c.block_size);
    free(t);
    return rc;
}
