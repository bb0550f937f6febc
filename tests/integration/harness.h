/*
 * Integration test harness: a real nats-server on 127.0.0.1 (ephemeral ports, or a given one for
 * restarts), the real kvrouter/kvworker binaries as child processes, and a NATS client that sends
 * GenerateRequests and collects the streamed answers. Every process a test starts is killed when
 * the test ends (and dies with it if the test crashes).
 */
#ifndef KVR_HARNESS_H
#define KVR_HARNESS_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include <nats/nats.h>

struct nats_srv {
    pid_t pid;
    int port;
    char url[128];
    char monitor[128];
    char cluster[128]; /* its cluster listen URL, when clustered */
    char dir[256];
};

/* Start nats-server (port 0: ephemeral); waits until it accepts clients. false on failure. */
bool h_nats_start(struct nats_srv *s, int port);
/*
 * Start a cluster node named name (cluster "kvr", ephemeral cluster port) routing to seed's cluster
 * URL (seed NULL: it is the seed), on client port port (0: ephemeral).
 */
bool h_nats_start_node(struct nats_srv *s, int port, const char *name, const struct nats_srv *seed);
/* Wait until every one of the n nodes has n - 1 routes; false on timeout. */
bool h_cluster_wait(const struct nats_srv *nodes, int n, int timeout_ms);
void h_nats_stop(struct nats_srv *s);

/* Start one of our binaries (name: "kvrouter", "kvworker") with extra args (NULL-terminated). */
pid_t h_spawn(const char *name, const char *const *args);
void h_signal(pid_t pid, int sig);
/* Wait for pid to exit within ms; returns its exit status, or -1 on timeout (then it is killed). */
int h_wait(pid_t pid, int ms);
/* Kill every process started (called by the fixtures). */
void h_kill_all(void);

/* What a request got back. */
struct h_result {
    uint32_t chunks;     /* chunks received */
    uint32_t tokens;     /* tokens received */
    bool final;          /* a final chunk arrived */
    uint32_t error_code; /* its kvr_status */
    bool error_header;   /* it carried Nats-Service-Error-Code */
    uint64_t worker_id;  /* who served it */
    uint64_t first_ms;   /* time to first token */
    uint64_t total_ms;   /* time to the final chunk */
};

/* A client request in flight. */
struct h_req {
    natsSubscription *sub;
    uint64_t t0;
    struct h_result res;
    char inbox[128];    /* its reply subject */
    uint8_t data[4096]; /* its bytes, for resends (len 0: too large to keep) */
    int len;            /* */
    uint32_t resends;   /* times it was sent again */
    uint32_t extra;     /* chunks that came after the final one */
};

/* Publish a GenerateRequest on subject; collect with h_collect. prompt: n tokens from base. */
bool h_send(natsConnection *nc, const char *subject, struct h_req *q, const char *id, uint32_t base,
            uint32_t shared, uint32_t n, uint32_t max_tokens);
/* Publish raw bytes as a request (for malformed input). */
bool h_send_raw(natsConnection *nc, const char *subject, struct h_req *q, const void *data,
                int len);
/* Read chunks until one names the worker serving q (0: none within timeout_ms). */
uint64_t h_first_worker(struct h_req *q, int timeout_ms);
/* Read chunks until the final one or timeout_ms; returns whether the final chunk arrived. */
bool h_collect(struct h_req *q, int timeout_ms);
/*
 * The same, as a client of a router fleet does: when nothing came for resend_ms, send the same
 * request again (same reply subject and id; routers absorb a resend of what the fleet has in
 * flight), at most max_resends times.
 */
bool h_collect_resend(natsConnection *nc, const char *subject, struct h_req *q, int resend_ms,
                      uint32_t max_resends, int timeout_ms, int linger_ms);

natsConnection *h_connect(const char *url);
uint64_t h_now_ms(void);
void h_sleep_ms(int ms);

/* GET url (monitoring), into buf; false on failure. */
bool h_http_get(const char *url, char *buf, size_t len);

#endif
