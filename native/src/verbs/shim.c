/* A flat C face over libibverbs and librdmacm for the native verbs transport (verbs/mod.rs).
 *
 * Both libraries are opened at run time (dlopen + dlsym), so the extension module has no link-time
 * dependency on rdma-core: on a host without it the module still imports and runs tcp/shm, and
 * hv_load() says why verbs cannot run. From the headers only the types are used, and the ops-table
 * inline functions (ibv_post_send, ibv_post_recv, ibv_poll_cq, ibv_req_notify_cq), which call through
 * the device's function table, not an exported symbol. Every exported function is called through a
 * pointer named p_<function> so that no header macro (ibv_reg_mr expands to ibv_reg_mr_iova2 in new
 * headers) can turn into a direct symbol reference; tests check the .so has no undefined ibv_/rdma_.
 *
 * Calls here never block: channels are made non-blocking, and Rust waits on their descriptors.
 */
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#define FN(ret, name, args) static ret (*p_##name) args
FN(struct ibv_pd *, ibv_alloc_pd, (struct ibv_context *));
FN(int, ibv_dealloc_pd, (struct ibv_pd *));
FN(struct ibv_mr *, ibv_reg_mr, (struct ibv_pd *, void *, size_t, int));
FN(int, ibv_dereg_mr, (struct ibv_mr *));
FN(struct ibv_comp_channel *, ibv_create_comp_channel, (struct ibv_context *));
FN(int, ibv_destroy_comp_channel, (struct ibv_comp_channel *));
FN(struct ibv_cq *, ibv_create_cq, (struct ibv_context *, int, void *, struct ibv_comp_channel *, int));
FN(int, ibv_destroy_cq, (struct ibv_cq *));
FN(int, ibv_get_cq_event, (struct ibv_comp_channel *, struct ibv_cq **, void **));
FN(void, ibv_ack_cq_events, (struct ibv_cq *, unsigned int));
FN(struct ibv_qp *, ibv_create_qp, (struct ibv_pd *, struct ibv_qp_init_attr *));
FN(int, ibv_modify_qp, (struct ibv_qp *, struct ibv_qp_attr *, int));
FN(int, ibv_destroy_qp, (struct ibv_qp *));
FN(const char *, ibv_wc_status_str, (enum ibv_wc_status));
FN(struct rdma_event_channel *, rdma_create_event_channel, (void));
FN(void, rdma_destroy_event_channel, (struct rdma_event_channel *));
FN(int, rdma_create_id, (struct rdma_event_channel *, struct rdma_cm_id **, void *, enum rdma_port_space));
FN(int, rdma_destroy_id, (struct rdma_cm_id *));
FN(int, rdma_bind_addr, (struct rdma_cm_id *, struct sockaddr *));
FN(int, rdma_listen, (struct rdma_cm_id *, int));
FN(int, rdma_resolve_addr, (struct rdma_cm_id *, struct sockaddr *, struct sockaddr *, int));
FN(int, rdma_resolve_route, (struct rdma_cm_id *, int));
FN(int, rdma_connect, (struct rdma_cm_id *, struct rdma_conn_param *));
FN(int, rdma_accept, (struct rdma_cm_id *, struct rdma_conn_param *));
FN(int, rdma_establish, (struct rdma_cm_id *));
FN(int, rdma_disconnect, (struct rdma_cm_id *));
FN(int, rdma_get_cm_event, (struct rdma_event_channel *, struct rdma_cm_event **));
FN(int, rdma_ack_cm_event, (struct rdma_cm_event *));
FN(int, rdma_init_qp_attr, (struct rdma_cm_id *, struct ibv_qp_attr *, int *));
FN(const char *, rdma_event_str, (enum rdma_cm_event_type));
FN(uint16_t, rdma_get_src_port, (struct rdma_cm_id *));

static int loaded; /* 1 ok, -1 failed (why in load_error) */
static char load_error[256];

#define RESOLVE(lib, name)                                                              \
    do {                                                                                \
        *(void **)(&p_##name) = dlsym(lib, #name);                                      \
        if (!p_##name) {                                                                \
            snprintf(load_error, sizeof load_error, "%s has no %s", #lib, #name);       \
            return -1;                                                                  \
        }                                                                               \
    } while (0)

/* The library's soname, or the file $<env> names instead (tests name a missing one). */
static void *open_lib(const char *env, const char *soname, const char *package) {
    const char *name = getenv(env);
    if (!name || !*name)
        name = soname;
    void *lib = dlopen(name, RTLD_NOW | RTLD_GLOBAL);
    if (!lib)
        snprintf(load_error, sizeof load_error, "cannot load %s (install rdma-core's %s): %s", name, package,
                 dlerror());
    return lib;
}

static int load_all(void) {
    void *libibverbs = open_lib("HPCNET_LIBIBVERBS", "libibverbs.so.1", "libibverbs1");
    if (!libibverbs)
        return -1;
    void *librdmacm = open_lib("HPCNET_LIBRDMACM", "librdmacm.so.1", "librdmacm1");
    if (!librdmacm)
        return -1;
    RESOLVE(libibverbs, ibv_alloc_pd);
    RESOLVE(libibverbs, ibv_dealloc_pd);
    RESOLVE(libibverbs, ibv_reg_mr);
    RESOLVE(libibverbs, ibv_dereg_mr);
    RESOLVE(libibverbs, ibv_create_comp_channel);
    RESOLVE(libibverbs, ibv_destroy_comp_channel);
    RESOLVE(libibverbs, ibv_create_cq);
    RESOLVE(libibverbs, ibv_destroy_cq);
    RESOLVE(libibverbs, ibv_get_cq_event);
    RESOLVE(libibverbs, ibv_ack_cq_events);
    RESOLVE(libibverbs, ibv_create_qp);
    RESOLVE(libibverbs, ibv_modify_qp);
    RESOLVE(libibverbs, ibv_destroy_qp);
    RESOLVE(libibverbs, ibv_wc_status_str);
    RESOLVE(librdmacm, rdma_create_event_channel);
    RESOLVE(librdmacm, rdma_destroy_event_channel);
    RESOLVE(librdmacm, rdma_create_id);
    RESOLVE(librdmacm, rdma_destroy_id);
    RESOLVE(librdmacm, rdma_bind_addr);
    RESOLVE(librdmacm, rdma_listen);
    RESOLVE(librdmacm, rdma_resolve_addr);
    RESOLVE(librdmacm, rdma_resolve_route);
    RESOLVE(librdmacm, rdma_connect);
    RESOLVE(librdmacm, rdma_accept);
    RESOLVE(librdmacm, rdma_establish);
    RESOLVE(librdmacm, rdma_disconnect);
    RESOLVE(librdmacm, rdma_get_cm_event);
    RESOLVE(librdmacm, rdma_ack_cm_event);
    RESOLVE(librdmacm, rdma_init_qp_attr);
    RESOLVE(librdmacm, rdma_event_str);
    RESOLVE(librdmacm, rdma_get_src_port);
    return 0;
}

/* 0 when both libraries are usable; else -1 and `err` says why (one line). Called once per process
 * from Rust (under a OnceLock). */
int hv_load(char *err, int errlen) {
    if (!loaded)
        loaded = load_all() == 0 ? 1 : -1;
    if (loaded < 0) {
        snprintf(err, errlen, "%s", load_error);
        return -1;
    }
    return 0;
}

static int nonblocking(int fd) {
    int flags = fcntl(fd, F_GETFL);
    return flags < 0 ? -1 : fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

/* -- rdma_cm ------------------------------------------------------------------------------------ */

void *hv_channel_create(void) {
    struct rdma_event_channel *ch = p_rdma_create_event_channel();
    if (ch && nonblocking(ch->fd)) {
        p_rdma_destroy_event_channel(ch);
        return NULL;
    }
    return ch;
}

int hv_channel_fd(void *ch) { return ((struct rdma_event_channel *)ch)->fd; }
void hv_channel_destroy(void *ch) { p_rdma_destroy_event_channel(ch); }

void *hv_id_create(void *ch) {
    struct rdma_cm_id *id = NULL;
    return p_rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) ? NULL : id;
}

int hv_id_destroy(void *id) { return p_rdma_destroy_id(id); }

static int ipv4(const char *host, int port, struct sockaddr_in *sa) {
    memset(sa, 0, sizeof *sa);
    sa->sin_family = AF_INET;
    sa->sin_port = htons((uint16_t)port);
    if (inet_pton(AF_INET, host, &sa->sin_addr) != 1) {
        errno = EINVAL;
        return -1;
    }
    return 0;
}

int hv_bind_listen(void *id, const char *host, int port, int backlog) {
    struct sockaddr_in sa;
    if (ipv4(host, port, &sa))
        return -1;
    if (p_rdma_bind_addr(id, (struct sockaddr *)&sa))
        return -1;
    return p_rdma_listen(id, backlog);
}

int hv_resolve_addr(void *id, const char *host, int port, int timeout_ms) {
    struct sockaddr_in sa;
    if (ipv4(host, port, &sa))
        return -1;
    return p_rdma_resolve_addr(id, NULL, (struct sockaddr *)&sa, timeout_ms);
}

int hv_resolve_route(void *id, int timeout_ms) { return p_rdma_resolve_route(id, timeout_ms); }

/* One rdma_cm event, acked before returning: its type, status, the id it is about (for a
 * CONNECT_REQUEST the new child id) and the listening id. -1 with errno EAGAIN when there is none. */
struct hv_cm_event {
    int kind;
    int status;
    void *id;
    void *listen_id;
};

int hv_get_event(void *ch, struct hv_cm_event *out) {
    struct rdma_cm_event *ev;
    if (p_rdma_get_cm_event(ch, &ev))
        return -1;
    out->kind = ev->event;
    out->status = ev->status;
    out->id = ev->id;
    out->listen_id = ev->listen_id;
    p_rdma_ack_cm_event(ev);
    return 0;
}

const char *hv_event_name(int kind) { return p_rdma_event_str(kind); }

static void conn_param(struct rdma_conn_param *p, uint32_t qpn, int retry) {
    memset(p, 0, sizeof *p);
    p->responder_resources = 4;
    p->initiator_depth = 4;
    p->retry_count = retry;
    p->rnr_retry_count = 7;
    p->qp_num = qpn;
}

int hv_connect(void *id, uint32_t qpn, int retry) {
    struct rdma_conn_param p;
    conn_param(&p, qpn, retry);
    return p_rdma_connect(id, &p);
}

int hv_accept(void *id, uint32_t qpn, int retry) {
    struct rdma_conn_param p;
    conn_param(&p, qpn, retry);
    return p_rdma_accept(id, &p);
}

int hv_establish(void *id) { return p_rdma_establish(id); }
int hv_disconnect(void *id) { return p_rdma_disconnect(id); }

/* -- one endpoint: protection domain, completion channel, CQ, an RC QP we own ------------------- */

struct hv_ep {
    struct ibv_pd *pd;
    struct ibv_comp_channel *cc;
    struct ibv_cq *cq;
    struct ibv_qp *qp;
    unsigned unacked; /* CQ events taken but not acked (acked in batches, and all before destroy) */
    uint32_t max_inline; /* sends this short go inline (copied into the work request at post time) */
};

/* Inline sends: a short message's bytes go in the work request itself, so the device takes no
 * look-up of the buffer's registration or DMA read of it (as perftest's ib_send_lat sends its 2-byte
 * messages). The caller's max_inline (verbs::max_inline) covers an RPC's small frames. */

void hv_ep_destroy(struct hv_ep *ep);

struct hv_ep *hv_ep_create(void *cm_id, int send_depth, int recv_depth, int cq_depth, int max_inline) {
    struct rdma_cm_id *id = cm_id;
    struct hv_ep *ep = calloc(1, sizeof *ep);
    if (!ep)
        return NULL;
    if (!id->verbs) {
        errno = ENODEV;
        free(ep);
        return NULL;
    }
    if (!(ep->pd = p_ibv_alloc_pd(id->verbs)) || !(ep->cc = p_ibv_create_comp_channel(id->verbs)) ||
        nonblocking(ep->cc->fd) || !(ep->cq = p_ibv_create_cq(id->verbs, cq_depth, NULL, ep->cc, 0)))
        goto fail;
    struct ibv_qp_init_attr attr;
    memset(&attr, 0, sizeof attr);
    attr.qp_type = IBV_QPT_RC;
    attr.send_cq = attr.recv_cq = ep->cq;
    attr.cap.max_send_wr = send_depth;
    attr.cap.max_recv_wr = recv_depth;
    attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
    attr.cap.max_inline_data = max_inline;
    if (!(ep->qp = p_ibv_create_qp(ep->pd, &attr))) {
        attr.cap.max_inline_data = 0; /* a device without inline sends: every send from its buffer */
        if (!(ep->qp = p_ibv_create_qp(ep->pd, &attr)))
            goto fail;
    }
    ep->max_inline = attr.cap.max_inline_data;
    return ep;
fail:;
    int saved = errno;
    hv_ep_destroy(ep);
    errno = saved;
    return NULL;
}

uint32_t hv_ep_qpn(struct hv_ep *ep) { return ep->qp->qp_num; }
int hv_ep_fd(struct hv_ep *ep) { return ep->cc->fd; }

/* Move the QP to INIT (1), RTR (2) or RTS (3) with rdma_cm's attributes; RTS with our own time-out
 * and retries (a dead peer shows as a failed work request within the RC retries). */
int hv_ep_modify(struct hv_ep *ep, void *cm_id, int state, int timeout, int retry) {
    static const enum ibv_qp_state states[] = {IBV_QPS_RESET, IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS};
    struct ibv_qp_attr attr;
    int mask = 0;
    memset(&attr, 0, sizeof attr);
    attr.qp_state = states[state];
    if (p_rdma_init_qp_attr(cm_id, &attr, &mask))
        return -1;
    if (state == 3) {
        attr.timeout = timeout;
        attr.retry_cnt = retry;
        attr.rnr_retry = 7;
        mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY;
    }
    return p_ibv_modify_qp(ep->qp, &attr, mask);
}

void hv_ep_destroy(struct hv_ep *ep) {
    if (!ep)
        return;
    if (ep->qp)
        p_ibv_destroy_qp(ep->qp);
    if (ep->cq) {
        if (ep->unacked)
            p_ibv_ack_cq_events(ep->cq, ep->unacked);
        p_ibv_destroy_cq(ep->cq);
    }
    if (ep->cc)
        p_ibv_destroy_comp_channel(ep->cc);
    if (ep->pd)
        p_ibv_dealloc_pd(ep->pd);
    free(ep);
}

/* -- memory ------------------------------------------------------------------------------------- */

struct hv_mr {
    void *mr;
    uint32_t lkey;
    uint32_t rkey;
};

/* access bits: 1 local write, 2 remote write, 4 remote read (IBV_ACCESS_* values) */
int hv_reg(struct hv_ep *ep, void *addr, size_t len, int access, struct hv_mr *out) {
    struct ibv_mr *mr = p_ibv_reg_mr(ep->pd, addr, len, access);
    if (!mr)
        return -1;
    out->mr = mr;
    out->lkey = mr->lkey;
    out->rkey = mr->rkey;
    return 0;
}

int hv_dereg(void *mr) { return p_ibv_dereg_mr(mr); }

/* -- work requests and completions -------------------------------------------------------------- */

int hv_post_recv(struct hv_ep *ep, uint64_t wr_id, uint64_t addr, uint32_t len, uint32_t lkey) {
    struct ibv_sge sge = {.addr = addr, .length = len, .lkey = lkey};
    struct ibv_recv_wr wr = {.wr_id = wr_id, .sg_list = &sge, .num_sge = 1}, *bad;
    int rc = ibv_post_recv(ep->qp, &wr, &bad);
    if (rc)
        errno = rc;
    return rc ? -1 : 0;
}

/* opcode: 0 SEND, 1 RDMA WRITE, 2 RDMA READ; always signaled; a send of at most max_inline bytes inline */
int hv_post_send(struct hv_ep *ep, uint64_t wr_id, int opcode, uint64_t addr, uint32_t len, uint32_t lkey,
                 uint64_t remote_addr, uint32_t rkey) {
    static const enum ibv_wr_opcode ops[] = {IBV_WR_SEND, IBV_WR_RDMA_WRITE, IBV_WR_RDMA_READ};
    struct ibv_sge sge = {.addr = addr, .length = len, .lkey = lkey};
    struct ibv_send_wr wr, *bad;
    memset(&wr, 0, sizeof wr);
    wr.wr_id = wr_id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = ops[opcode];
    wr.send_flags = IBV_SEND_SIGNALED;
    if (opcode == 0 && len <= ep->max_inline)
        wr.send_flags |= IBV_SEND_INLINE;
    wr.wr.rdma.remote_addr = remote_addr;
    wr.wr.rdma.rkey = rkey;
    int rc = ibv_post_send(ep->qp, &wr, &bad);
    if (rc)
        errno = rc;
    return rc ? -1 : 0;
}

struct hv_wc {
    uint64_t wr_id;
    uint32_t status;
    uint32_t byte_len;
};

/* Up to `n` completions into `out`; how many, or -1. */
int hv_poll(struct hv_ep *ep, struct hv_wc *out, int n) {
    struct ibv_wc wc[16];
    if (n > 16)
        n = 16;
    int got = ibv_poll_cq(ep->cq, n, wc);
    for (int i = 0; i < got; i++) {
        out[i].wr_id = wc[i].wr_id;
        out[i].status = wc[i].status;
        out[i].byte_len = wc[i].byte_len;
    }
    return got;
}

int hv_arm(struct hv_ep *ep) { return ibv_req_notify_cq(ep->cq, 0); }

/* Take every event waiting on the completion channel (non-blocking); how many. */
int hv_take_events(struct hv_ep *ep) {
    struct ibv_cq *cq;
    void *ctx;
    int n = 0;
    while (p_ibv_get_cq_event(ep->cc, &cq, &ctx) == 0)
        n++;
    ep->unacked += n;
    if (ep->unacked >= 64) {
        p_ibv_ack_cq_events(ep->cq, ep->unacked);
        ep->unacked = 0;
    }
    return n;
}

const char *hv_wc_status_name(int status) { return p_ibv_wc_status_str(status); }

int hv_src_port(void *id) { return p_rdma_get_src_port(id); }
