/*
 * kvsim: the offline tools of the routing core, one subcommand each (src/sim/cli_*.c):
 *   kvsim run      simulate a workload through the router and N engines in virtual time
 *   kvsim hash     block hashes of token ids, to check against an engine
 *   kvsim explain  route a generated workload and say why
 * No NATS, no clock: everything runs in virtual time on the pure core. This file only dispatches;
 * each subcommand parses its own options (its argv[0] is its name) and returns the exit status.
 */
#include <stdio.h>
#include <string.h>

#include "../sim/cli_explain.h"
#include "../sim/cli_hash.h"
#include "../sim/cli_run.h"
#include "kvr/policy.h"

static const struct {
    const char *name;
    int (*main)(int argc, char **argv);
    const char *summary;
} commands[] = {
    {"run", kvr_cli_run_main,
     "simulate the workload through the router and N engines in virtual time;\n"
     "      writes DIR/report.json, DIR/report.md and plots"},
    {"hash", kvr_cli_hash_main,
     "one line per full block: block index, local hash, sequence hash, each as\n"
     "      16 lower-case hex digits; a trailing partial block is not hashed"},
    {"explain", kvr_cli_explain_main,
     "route a generated shared-prefix workload through the decision pipeline\n"
     "      and print each decision and the candidates' costs behind it"},
};

#define NCOMMANDS (sizeof commands / sizeof commands[0])

static int usage(FILE *f)
{
    fprintf(f, "usage: kvsim COMMAND [options]   (kvsim COMMAND --help lists its options)\n");
    for (size_t i = 0; i < NCOMMANDS; i++)
        fprintf(f, "  kvsim %s\n      %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "policies:\n");
    for (int p = 0; p < KVR_POLICY_COUNT; p++)
        fprintf(f, "  %-20s %s\n", kvr_policy_name((enum kvr_policy)p),
                kvr_policy_desc((enum kvr_policy)p));
    return f == stderr ? 2 : 0;
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return usage(stderr);
    for (size_t i = 0; i < NCOMMANDS; i++)
        if (!strcmp(argv[1], commands[i].name))
            return commands[i].main(argc - 1, argv + 1);
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help"))
        return usage(stdout);
    fprintf(stderr, "kvsim: unknown command '%s'\n", argv[1]);
    return usage(stderr);
}
