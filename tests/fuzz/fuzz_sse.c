/*
 * The engine's bytes (src/openai): an input is an event stream. It is parsed whole and again cut
 * in three at points its first bytes choose, and both must give the same events (kvr_sse is
 * incremental: any split, the same result); every event's data goes through the chunk parser,
 * whose result must keep its promises (text NUL-terminated at its length, a bounded printable
 * finish_reason and reason). The same bytes are also read as an error body, as a Prometheus
 * exposition and as SGLang's /get_server_info. Any broken promise aborts.
 */
#include "chunk.h"
#include "fuzz.h"
#include "openai.h"
#include "sse.h"

#define MAX_EVENT 4096

struct seen {
    uint64_t hash; /* FNV-1a over every event's length and bytes */
    unsigned n;
    bool parse; /* also give each event to the chunk parser */
    struct kvr_oai_scratch scratch;
};

static void printable(const char *s, size_t max)
{
    size_t n = strlen(s);
    FUZZ_CHECK(n < max);
    for (size_t i = 0; i < n; i++)
        FUZZ_CHECK((unsigned char)s[i] >= 0x20 && (unsigned char)s[i] < 0x7f);
}

static void check_chunk(struct seen *s, const char *d, size_t len)
{
    struct kvr_oai_chunk c;
    char why[KVR_OAI_MESSAGE_MAX];
    why[0] = 0;
    kvr_status st = kvr_oai_chunk_parse(&s->scratch, d, len, &c, why, sizeof why);
    FUZZ_CHECK(st == KVR_OK || st == KVR_ERR_MALFORMED || st == KVR_ERR_IO || st == KVR_ERR_NOMEM);
    if (st != KVR_OK) {
        printable(why, sizeof why);
        return;
    }
    FUZZ_CHECK(c.text && c.text[c.text_len] == 0);
    FUZZ_CHECK(c.n_token_ids == 0 || c.token_ids);
    FUZZ_CHECK(c.text_len <= len);
    if (c.finish_reason)
        printable(c.finish_reason, KVR_OAI_FINISH_MAX);
}

static bool on_event(void *ctx, const char *d, size_t len)
{
    struct seen *s = ctx;
    FUZZ_CHECK(len <= MAX_EVENT && d[len] == 0);
    uint64_t h = s->hash ^ len;
    h *= 0x100000001b3ull;
    for (size_t i = 0; i < len; i++)
        h = (h ^ (uint8_t)d[i]) * 0x100000001b3ull;
    s->hash = h;
    s->n++;
    if (s->parse)
        check_chunk(s, d, len);
    return true;
}

static kvr_status feed(struct seen *s, const uint8_t *data, size_t size, size_t cut1, size_t cut2)
{
    struct kvr_sse p;
    kvr_sse_init(&p, MAX_EVENT);
    size_t cuts[4] = {0, cut1, cut2, size};
    kvr_status st = KVR_OK;
    for (int i = 0; i < 3 && st == KVR_OK; i++)
        st = kvr_sse_feed(&p, data + cuts[i], cuts[i + 1] - cuts[i], on_event, s);
    kvr_sse_free(&p);
    return st;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct seen whole = {.hash = 0xcbf29ce484222325ull, .parse = true};
    struct seen split = {.hash = 0xcbf29ce484222325ull};
    kvr_status a = feed(&whole, data, size, 0, 0);
    size_t c1 = size ? data[0] % (size + 1) : 0;
    size_t c2 = size > 1 ? c1 + data[1] % (size - c1 + 1) : c1;
    kvr_status b = feed(&split, data, size, c1, c2);
    FUZZ_CHECK(a == b);
    FUZZ_CHECK(a == KVR_OK || a == KVR_ERR_TOO_LARGE);
    FUZZ_CHECK(whole.n == split.n && whole.hash == split.hash);
    kvr_oai_scratch_free(&whole.scratch);

    char msg[KVR_OAI_MESSAGE_MAX];
    kvr_oai_error_message((const char *)data, size, msg, sizeof msg);
    printable(msg, sizeof msg);

    struct kvr_engine_metrics m;
    kvr_status st = kvr_oai_metrics_parse((const char *)data, size, &m);
    FUZZ_CHECK(st == KVR_OK || st == KVR_ERR_MALFORMED);
    FUZZ_CHECK(st != KVR_OK || m.samples > 0);
    FUZZ_CHECK(!m.have_kv_usage || (m.kv_usage >= 0 && m.kv_usage <= 1));
    FUZZ_CHECK(!m.have_capacity_tokens || m.capacity_tokens == m.num_blocks * m.block_size);
    if (kvr_oai_server_info_parse((const char *)data, size, &m) == KVR_OK)
        FUZZ_CHECK(m.have_block_size && m.block_size > 0 && m.have_num_blocks);
    return 0;
}
