/*
 * kvsim hash: the block hashes of a list of token ids, one line per full block (index, local
 * hash, sequence hash, 16 lower-case hex digits each), for operators to check an engine's KV
 * events against. A trailing partial block is never hashed. Runs on the main thread; no state.
 */
#ifndef KVR_CLI_HASH_H
#define KVR_CLI_HASH_H

/* The subcommand: argv[0] is "hash", then its options. Returns the exit status (0, 1 or 2). */
int kvr_cli_hash_main(int argc, char **argv);

#endif
