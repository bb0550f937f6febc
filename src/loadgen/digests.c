/*
 * kvbench --mode digest. The answers are parsed with jansson (the only user of it here).
 */
#include "digests.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

#define DIGEST_HEX 16 /* the router writes its digest as 16 lower-case hex digits */

/* The "digest" of answer data[0..len) into out (DIGEST_HEX + 1 bytes); false, reported, if none. */
static bool digest_of(const char *data, size_t len, char *out)
{
    json_error_t err;
    json_t *root = json_loadb(data, len, 0, &err);
    const char *d = json_string_value(json_object_get(root, "digest"));
    bool ok = d && strlen(d) == DIGEST_HEX && strspn(d, "0123456789abcdef") == DIGEST_HEX;
    if (ok)
        memcpy(out, d, DIGEST_HEX + 1);
    else if (!root)
        fprintf(stderr, "kvbench: a malformed answer (%s at byte %d): counted as a disagreement\n",
                err.text, err.position);
    else
        fprintf(stderr,
                "kvbench: an answer without a %d-hex-digit \"digest\": counted as a "
                "disagreement\n",
                DIGEST_HEX);
    json_decref(root);
    return ok;
}

/* Subscribe to a new inbox on the client's connection and ask the routers; NULL on failure. */
static natsSubscription *ask(const struct kvr_bench_config *cfg, struct kvr_client *c)
{
    char subj[256], inbox[64];
    natsInbox *ib = NULL;
    natsSubscription *sub = NULL;
    if (!kvr_subject(subj, sizeof subj, cfg->net.prefix, cfg->net.ns, "router.digest") ||
        natsInbox_Create(&ib) != NATS_OK)
        return NULL;
    snprintf(inbox, sizeof inbox, "%s", ib);
    natsInbox_Destroy(ib);
    if (natsConnection_SubscribeSync(&sub, c->nc_sub, inbox) != NATS_OK ||
        natsConnection_Flush(c->nc_sub) != NATS_OK ||
        natsConnection_PublishRequest(c->nc_pub, subj, inbox, "", 0) != NATS_OK) {
        natsSubscription_Destroy(sub);
        return NULL;
    }
    return sub;
}

int kvr_digests_check(const struct kvr_bench_config *cfg, struct kvr_client *client)
{
    natsSubscription *sub = ask(cfg, client);
    if (!sub)
        return 1;
    char first[DIGEST_HEX + 1] = "";
    int answers = 0, differ = 0;
    uint64_t end = kvr_now_ns() + cfg->digest_wait_ns;
    for (uint64_t now = kvr_now_ns(); now < end; now = kvr_now_ns()) {
        natsMsg *m = NULL;
        if (natsSubscription_NextMsg(&m, sub, (int64_t)((end - now) / KVR_NS_PER_MS + 1)) !=
            NATS_OK)
            break;
        const char *data = natsMsg_GetData(m);
        int len = natsMsg_GetDataLength(m);
        printf("%.*s\n", len, data);
        char digest[DIGEST_HEX + 1];
        answers++;
        if (!digest_of(data, (size_t)len, digest))
            differ++;
        else if (!first[0])
            memcpy(first, digest, sizeof digest);
        else
            differ += strcmp(first, digest) != 0;
        natsMsg_Destroy(m);
    }
    natsSubscription_Destroy(sub);
    fprintf(stderr, "kvbench: %d routers answered; %s\n", answers,
            !answers ? "none"
            : differ ? "their digests differ"
                     : "their digests agree");
    return answers && !differ ? 0 : 1;
}
