/*
 * kvr_loop: libevent's loop on a thread of its own, and the adapter nats.c's external event loop
 * needs (attach, read, write, detach: its callbacks, which it calls under the connection's lock).
 */
#include "loop.h"

#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>

#include <event2/event.h>
#include <event2/thread.h>

#include "clock.h"

static pthread_once_t threads_once = PTHREAD_ONCE_INIT;

static void use_threads(void)
{
    evthread_use_pthreads(); /* libevent's locks: nats.c attaches and writes from other threads */
}

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    (void)arg; /* nothing to do: the round ends, `after` runs and `stop` is seen */
}

/* libevent's callback for a connection's socket: note only (the loop thread acts after it). */
static void on_io(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    struct kvr_loop_conn *c = arg;
    if (what & EV_READ)
        atomic_store_explicit(&c->readable, true, memory_order_relaxed);
    if (what & EV_WRITE)
        atomic_store_explicit(&c->writable, true, memory_order_relaxed);
}

/* c's socket while nats.c polls it; -1 once it stopped (poll_read, detach). */
static int polled(struct kvr_loop_conn *c)
{
    return atomic_load_explicit(&c->fd, memory_order_relaxed);
}

/* Bytes waiting in socket fd (0 when it cannot tell: none attached, closed). */
static int waiting(int fd)
{
    int n = 0;
    return fd >= 0 && ioctl(fd, FIONREAD, &n) == 0 ? n : 0;
}

/*
 * After the round: what libevent found ready, written and read, and the sockets read on while
 * they hold more (nats.c reads one buffer at a time), KVR_LOOP_READS_MAX buffers per connection
 * at most. Returns whether they were found empty, so that everything that had reached them
 * before the call is read.
 */
static bool serve(struct kvr_loop *lp)
{
    bool empty = true;
    for (int i = 0; i < KVR_LOOP_CONNS; i++) {
        struct kvr_loop_conn *c = &lp->conn[i];
        natsConnection *nc = atomic_load_explicit(&c->nc, memory_order_acquire);
        if (!nc)
            continue;
        bool writable = atomic_exchange_explicit(&c->writable, false, memory_order_relaxed);
        bool readable = atomic_exchange_explicit(&c->readable, false, memory_order_relaxed);
        if (polled(c) < 0)
            continue; /* not polled: nats.c reconnects on its own thread (poll_read) */
        if (writable)
            natsConnection_ProcessWriteEvent(nc);
        unsigned r = 0;
        /* the fd is read again before every read: a write or read above may have broken the
         * connection (nats.c then stops polling it, on this thread, and reconnects on another,
         * whose new socket usually takes the same number) */
        if (readable && polled(c) >= 0) {
            natsConnection_ProcessReadEvent(nc); /* also what an empty socket says: closed */
            r++;
        }
        for (int fd; (fd = polled(c)) >= 0 && waiting(fd); r++) {
            if (r >= KVR_LOOP_READS_MAX) {
                empty = false; /* behind: heard_ns stays where it was */
                break;
            }
            natsConnection_ProcessReadEvent(nc);
        }
    }
    return empty;
}

static void *loop_main(void *arg)
{
    struct kvr_loop *lp = arg;
    while (!atomic_load_explicit(&lp->stop, memory_order_acquire)) {
        event_base_loop(lp->base, EVLOOP_ONCE);
        uint64_t now = kvr_now_ns(); /* before the sockets are read empty: all before it is read */
        bool empty = serve(lp);
        lp->after(lp->ctx); /* and now handled */
        if (empty)
            atomic_store_explicit(&lp->heard_ns, now, memory_order_release);
    }
    nats_ReleaseThreadMemory();
    return NULL;
}

kvr_status kvr_loop_start(struct kvr_loop *lp, uint64_t tick_ns, void (*after)(void *ctx),
                          void *ctx)
{
    memset(lp, 0, sizeof *lp);
    pthread_once(&threads_once, use_threads);
    lp->after = after;
    lp->ctx = ctx;
    for (int i = 0; i < KVR_LOOP_CONNS; i++) {
        lp->conn[i].lp = lp;
        atomic_store(&lp->conn[i].fd, -1);
    }
    pthread_mutex_init(&lp->attach_mu, NULL);
    atomic_store(&lp->heard_ns, kvr_now_ns());
    lp->base = event_base_new();
    if (lp->base)
        lp->tick = event_new(lp->base, -1, EV_PERSIST, on_tick, lp);
    tick_ns = tick_ns ? tick_ns : KVR_NS_PER_MS;
    struct timeval every = {(time_t)(tick_ns / KVR_NS_PER_S),
                            (suseconds_t)(tick_ns % KVR_NS_PER_S / 1000u)};
    if (!lp->tick || event_add(lp->tick, &every) != 0 ||
        pthread_create(&lp->thread, NULL, loop_main, lp)) {
        kvr_loop_free(lp);
        return KVR_ERR_NOMEM;
    }
    lp->running = true;
    return KVR_OK;
}

void kvr_loop_wake(struct kvr_loop *lp)
{
    if (lp->tick)
        event_active(lp->tick, EV_TIMEOUT, 0);
}

void kvr_loop_stop(struct kvr_loop *lp)
{
    if (!lp->running)
        return;
    atomic_store_explicit(&lp->stop, true, memory_order_release);
    kvr_loop_wake(lp);
    pthread_join(lp->thread, NULL);
    lp->running = false;
}

void kvr_loop_free(struct kvr_loop *lp)
{
    kvr_loop_stop(lp); /* then no callback runs: the events go */
    for (int i = 0; i < KVR_LOOP_CONNS; i++) {
        if (lp->conn[i].read)
            event_free(lp->conn[i].read);
        if (lp->conn[i].write)
            event_free(lp->conn[i].write);
    }
    if (lp->tick)
        event_free(lp->tick);
    if (lp->base) {
        event_base_free(lp->base);
        pthread_mutex_destroy(&lp->attach_mu);
    }
    memset(lp, 0, sizeof *lp);
}

uint64_t kvr_loop_heard(const struct kvr_loop *lp)
{
    return atomic_load_explicit(&lp->heard_ns, memory_order_acquire);
}

/* nats.c's attach (first connect and every reconnect, on its thread): events on the new socket.
 * Freeing the old ones waits at most for on_io, which takes no lock. */
static natsStatus attach(void **adapter, void *loop, natsConnection *nc, natsSock sock)
{
    struct kvr_loop *lp = loop;
    pthread_mutex_lock(&lp->attach_mu);
    struct kvr_loop_conn *c = NULL;
    for (int i = 0; i < KVR_LOOP_CONNS && !c; i++) /* its slot, or the first free one */
        if (atomic_load(&lp->conn[i].nc) == nc)
            c = &lp->conn[i];
    for (int i = 0; i < KVR_LOOP_CONNS && !c; i++)
        if (!atomic_load(&lp->conn[i].nc))
            c = &lp->conn[i];
    natsStatus s = c ? NATS_OK : NATS_ERR; /* more connections than a loop reads */
    if (c) {
        if (c->read)
            event_free(c->read);
        if (c->write)
            event_free(c->write);
        c->read = event_new(lp->base, sock, EV_READ | EV_PERSIST, on_io, c);
        c->write = event_new(lp->base, sock, EV_WRITE | EV_PERSIST, on_io, c);
        atomic_store_explicit(&c->fd, (int)sock, memory_order_relaxed);
        atomic_store_explicit(&c->nc, nc, memory_order_release);
        if (!c->read || !c->write || event_add(c->read, NULL) != 0)
            s = NATS_NO_MEMORY;
        *adapter = c;
    }
    pthread_mutex_unlock(&lp->attach_mu);
    return s;
}

/*
 * nats.c's wish to poll its socket for reading, or not. It asks "not" as the connection breaks,
 * just before it closes the socket and reconnects on its own thread; its next attach brings the
 * new socket once the handshake is done. Until then the loop must not read: nats.c 3.4.1 reads
 * outside the connection's lock (fixed in 3.10, nats.c #815), so a read of the socket number,
 * which the new socket usually takes, raced the reconnect's handshake on it and its close when
 * the server refused (TSan saw the close; the bytes of the INFO could have been stolen too).
 */
static natsStatus poll_read(void *adapter, bool add)
{
    struct kvr_loop_conn *c = adapter;
    if (!add) {
        atomic_store_explicit(&c->fd, -1, memory_order_relaxed); /* serve() reads it no more */
        atomic_store_explicit(&c->readable, false, memory_order_relaxed);
    }
    int rc = add ? event_add(c->read, NULL) : event_del_noblock(c->read);
    if (add && rc == 0)
        atomic_store_explicit(&c->fd, (int)event_get_fd(c->read), memory_order_relaxed);
    return rc == 0 ? NATS_OK : NATS_ERR;
}

/* nats.c's wish to poll its socket for writing (it has buffered what it could not send). */
static natsStatus poll_write(void *adapter, bool add)
{
    struct kvr_loop_conn *c = adapter;
    return (add ? event_add(c->write, NULL) : event_del_noblock(c->write)) == 0 ? NATS_OK
                                                                                : NATS_ERR;
}

/* nats.c's connection is closing: its socket is polled no more (the events go with the loop). */
static natsStatus detach(void *adapter)
{
    struct kvr_loop_conn *c = adapter;
    event_del_noblock(c->read);
    event_del_noblock(c->write);
    atomic_store_explicit(&c->fd, -1, memory_order_relaxed);
    atomic_store_explicit(&c->nc, NULL, memory_order_release); /* its slot is free again */
    return NATS_OK;
}

natsStatus kvr__loop_options(natsOptions *o, struct kvr_loop *lp)
{
    if (!lp)
        return NATS_OK;
    return natsOptions_SetEventLoop(o, lp, attach, poll_read, poll_write, detach);
}
