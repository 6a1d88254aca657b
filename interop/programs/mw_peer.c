/*
 * mw_peer: memory windows between two RDMA devices, one program for both ends.
 *
 * Part of the softverbs <-> rdma_rxe interop suite (interop/README.md, issue #16). The
 * same binary runs in the guest on rdma-core's libibverbs and the rxe provider and on the
 * host on the softverbs drop-in libibverbs.so.1 (LD_LIBRARY_PATH), so it uses only the
 * verbs of the man pages: ibv_alloc_mw(3), ibv_bind_mw(3), ibv_post_send(3)
 * (IBV_WR_BIND_MW, IBV_WR_LOCAL_INV, IBV_WR_SEND_WITH_INV), ibv_inc_rkey(3),
 * ibv_poll_cq(3).
 *
 *   mw_peer -t TEST [-d DEV] [-i IB_PORT] -g GID_INDEX [-p TCP_PORT] [-m MTU]   (binder)
 *   mw_peer -t TEST [-d DEV] [-i IB_PORT] -g GID_INDEX [-p TCP_PORT] [-m MTU] HOST (user)
 *
 * Without HOST the program is the "binder": it listens on TCP_PORT, registers a buffer
 * with IBV_ACCESS_MW_BIND, binds memory windows to a strict sub-range of it and hands
 * their address, length and R_Key to its peer. With HOST it is the "user": it connects
 * there and reaches the binder's memory only through those windows. The two exchange QP
 * numbers, PSNs and GIDs over that TCP connection (as ibv_rc_pingpong does) and use it
 * to take turns; the RC QPs carry the data. TEST is one of:
 *
 *   local_inv  type 2 window: RDMA WRITE of the whole window and READ back, SEND; the
 *              binder checks the bytes landed in the window only, invalidates the window
 *              with IBV_WR_LOCAL_INV; a WRITE through the old R_Key must complete with
 *              IBV_WC_REM_ACCESS_ERR and change nothing
 *   send_inv   the same, the window invalidated by the user's IBV_WR_SEND_WITH_INV (the
 *              binder's receive completion carries IBV_WC_WITH_INV and the R_Key)
 *   bounds     a WRITE of the whole window, then one reaching 8 bytes past its end
 *              (inside the region), and on a second QP and window a READ starting 8
 *              bytes before it: both IBV_WC_REM_ACCESS_ERR, nothing written outside
 *   other_qp   a type 2 window is reached through the QP it was bound on only: a WRITE
 *              through that QP succeeds, one through another QP to the same peer
 *              completes with IBV_WC_REM_ACCESS_ERR
 *   type1      a type 1 window bound with ibv_bind_mw(3): WRITE and READ back, SEND,
 *              then the binder unbinds it (a bind of length 0, ibv_alloc_mw(3)); a WRITE
 *              through the old R_Key must complete with IBV_WC_REM_ACCESS_ERR
 *
 * A WRITE or READ that is refused moves the user's QP to the error state, so each test
 * ends a QP with at most one refused access, and a test with two uses two QPs.
 *
 * Every check prints one line, "mw_peer: check NAME: ok (...)" or
 * "mw_peer: check NAME: FAIL: ...", and the last line counts them; the exit status is 0
 * only if every check passed. Every wait is bounded (completions 20 s, the peer 60 s).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#define MAX_QPS 2
#define WIN_OFFSET 1027 /* the window starts at an odd offset into the region */
#define GUARD 0xee      /* every byte of the binder's region before any access */
#define PROBE 16        /* length of the accesses that cross a window's edge */
#define SEND_LEN 8
#define WC_TIMEOUT_S 20
#define PEER_TIMEOUT_S 60

enum { WRID_BIND = 1, WRID_INV, WRID_RECV, WRID_SEND, WRID_WRITE, WRID_READ };

struct options {
	const char *dev;
	const char *server; /* NULL: binder */
	const char *test;
	int ib_port, gid_index, tcp_port, mtu;
};

/* One RC QP with its own CQ. */
struct conn {
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	uint32_t psn;
};

/* A window as the user learns it from the binder. */
struct window {
	uint64_t addr, len;
	uint32_t rkey;
};

struct peer {
	struct options o;
	int binder;
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	union ibv_gid gid;
	struct conn qp[MAX_QPS];
	int nqp;
	/* binder: the region the windows are bound to; user: source and read target */
	uint8_t *buf;
	size_t len;
	struct ibv_mr *mr;
	/* SENDs: the binder receives into msg, the user sends from it */
	uint8_t msg[64];
	struct ibv_mr *msg_mr;
	struct ibv_mw *mw[MAX_QPS];
	uint64_t win_len;
	int sock;
	FILE *ctl;
	int checks, failed;
};

/* ---------------------------------------------------------------------------------- */
/* Reporting                                                                          */
/* ---------------------------------------------------------------------------------- */

__attribute__((format(printf, 4, 5)))
static void check(struct peer *p, int ok, const char *name, const char *fmt, ...)
{
	va_list ap;

	p->checks++;
	p->failed += !ok;
	printf("mw_peer: check %s: %s", name, ok ? "ok (" : "FAIL: ");
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("%s\n", ok ? ")" : "");
	fflush(stdout);
}

/* Something the tests cannot go on from: counted as a failed check, then exit 1. */
__attribute__((format(printf, 2, 3), noreturn))
static void fatal(struct peer *p, const char *fmt, ...)
{
	va_list ap;

	printf("mw_peer: FAIL: ");
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\nmw_peer: %s: stopped after %d checks, %d failed\n",
	       p->binder ? "binder" : "user", p->checks, p->failed + 1);
	fflush(stdout);
	exit(1);
}

static const char *status_name(int status)
{
	return status < 0 ? "no completion within the time limit" : ibv_wc_status_str(status);
}

static const char *opcode_name(int opcode)
{
	switch (opcode) {
	case IBV_WC_SEND: return "IBV_WC_SEND";
	case IBV_WC_RDMA_WRITE: return "IBV_WC_RDMA_WRITE";
	case IBV_WC_RDMA_READ: return "IBV_WC_RDMA_READ";
	case IBV_WC_BIND_MW: return "IBV_WC_BIND_MW";
	case IBV_WC_LOCAL_INV: return "IBV_WC_LOCAL_INV";
	case IBV_WC_RECV: return "IBV_WC_RECV";
	}
	return "another opcode";
}

/* ---------------------------------------------------------------------------------- */
/* The TCP control connection: one line per message                                  */
/* ---------------------------------------------------------------------------------- */

__attribute__((format(printf, 2, 3)))
static void ctl_send(struct peer *p, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vfprintf(p->ctl, fmt, ap);
	va_end(ap);
	fputc('\n', p->ctl);
	if (fflush(p->ctl))
		fatal(p, "control connection: write: %s", strerror(errno));
}

/* Reads the next line into line; it must start with the word tag. */
static void ctl_recv(struct peer *p, const char *tag, char *line, size_t size)
{
	size_t n = strlen(tag);

	if (!fgets(line, size, p->ctl))
		fatal(p, "control connection: waiting for %s: %s", tag,
		      ferror(p->ctl) ? strerror(errno) : "the peer closed it");
	if (strncmp(line, tag, n) || (line[n] != ' ' && line[n] != '\n'))
		fatal(p, "control connection: wanted %s, got %.60s", tag, line);
}

static int tcp_listen_accept(struct peer *p)
{
	struct sockaddr_in6 a6 = { .sin6_family = AF_INET6, .sin6_addr = IN6ADDR_ANY_INIT };
	struct pollfd pfd = { .events = POLLIN };
	int one = 1, zero = 0, s, c;

	a6.sin6_port = htons(p->o.tcp_port);
	s = socket(AF_INET6, SOCK_STREAM, 0);
	if (s < 0)
		fatal(p, "socket: %s", strerror(errno));
	setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	/* one socket for IPv4 and IPv6 peers */
	setsockopt(s, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
	if (bind(s, (struct sockaddr *)&a6, sizeof(a6)) || listen(s, 1))
		fatal(p, "listen on TCP port %d: %s", p->o.tcp_port, strerror(errno));
	pfd.fd = s;
	if (poll(&pfd, 1, PEER_TIMEOUT_S * 1000) != 1)
		fatal(p, "no peer connected to TCP port %d within %d s", p->o.tcp_port,
		      PEER_TIMEOUT_S);
	c = accept(s, NULL, NULL);
	if (c < 0)
		fatal(p, "accept: %s", strerror(errno));
	close(s);
	return c;
}

static int tcp_connect(struct peer *p)
{
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM }, *res, *r;
	char port[16];
	int s = -1, err;

	snprintf(port, sizeof(port), "%d", p->o.tcp_port);
	err = getaddrinfo(p->o.server, port, &hints, &res);
	if (err)
		fatal(p, "resolve %s: %s", p->o.server, gai_strerror(err));
	for (r = res; r && s < 0; r = r->ai_next) {
		s = socket(r->ai_family, r->ai_socktype, r->ai_protocol);
		if (s >= 0 && connect(s, r->ai_addr, r->ai_addrlen)) {
			close(s);
			s = -1;
		}
	}
	freeaddrinfo(res);
	if (s < 0)
		fatal(p, "connect to %s:%d: %s", p->o.server, p->o.tcp_port, strerror(errno));
	return s;
}

static void ctl_open(struct peer *p)
{
	struct timeval tv = { .tv_sec = PEER_TIMEOUT_S };

	p->sock = p->binder ? tcp_listen_accept(p) : tcp_connect(p);
	setsockopt(p->sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	p->ctl = fdopen(p->sock, "r+");
	if (!p->ctl)
		fatal(p, "fdopen: %s", strerror(errno));
}

/* ---------------------------------------------------------------------------------- */
/* Verbs                                                                              */
/* ---------------------------------------------------------------------------------- */

static enum ibv_mtu mtu_enum(struct peer *p, int mtu)
{
	switch (mtu) {
	case 256: return IBV_MTU_256;
	case 512: return IBV_MTU_512;
	case 1024: return IBV_MTU_1024;
	case 2048: return IBV_MTU_2048;
	case 4096: return IBV_MTU_4096;
	}
	fatal(p, "-m %d: not an IB MTU", mtu);
	return IBV_MTU_1024;
}

static void open_device(struct peer *p)
{
	struct ibv_device **list = ibv_get_device_list(NULL), *dev = NULL;
	int i;

	if (!list || !list[0])
		fatal(p, "no RDMA device");
	for (i = 0; list[i] && !dev; i++)
		if (!p->o.dev || !strcmp(ibv_get_device_name(list[i]), p->o.dev))
			dev = list[i];
	if (!dev)
		fatal(p, "no RDMA device %s", p->o.dev);
	p->ctx = ibv_open_device(dev);
	if (!p->ctx)
		fatal(p, "open device %s", ibv_get_device_name(dev));
	ibv_free_device_list(list);
	p->pd = ibv_alloc_pd(p->ctx);
	if (!p->pd)
		fatal(p, "ibv_alloc_pd");
	if (ibv_query_gid(p->ctx, p->o.ib_port, p->o.gid_index, &p->gid))
		fatal(p, "ibv_query_gid(port %d, index %d)", p->o.ib_port, p->o.gid_index);
}

static void register_memory(struct peer *p)
{
	int mtu = p->o.mtu, access;
	size_t i;

	p->win_len = 4 * (uint64_t)mtu + 3; /* FIRST, three MIDDLEs, LAST of 3 bytes */
	if (p->binder) {
		/* the window [WIN_OFFSET, WIN_OFFSET + win_len) and at least 2 KiB after it */
		p->len = (WIN_OFFSET + p->win_len + 2048 + 4095) & ~(size_t)4095;
		access = IBV_ACCESS_MW_BIND | IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
			 IBV_ACCESS_REMOTE_READ;
	} else {
		/* what the user writes, then where its READs land */
		p->len = 2 * p->win_len;
		access = IBV_ACCESS_LOCAL_WRITE;
	}
	if (posix_memalign((void **)&p->buf, 4096, p->len))
		fatal(p, "posix_memalign");
	for (i = 0; i < p->len; i++)
		p->buf[i] = GUARD;
	p->mr = ibv_reg_mr(p->pd, p->buf, p->len, access);
	if (!p->mr)
		fatal(p, "ibv_reg_mr(%zu bytes, access %#x): %s", p->len, access, strerror(errno));
	p->msg_mr = ibv_reg_mr(p->pd, p->msg, sizeof(p->msg), IBV_ACCESS_LOCAL_WRITE);
	if (!p->msg_mr)
		fatal(p, "ibv_reg_mr(message buffer): %s", strerror(errno));
}

static void create_qps(struct peer *p, int n)
{
	struct ibv_qp_init_attr init = {
		.cap = { .max_send_wr = 8, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
		.sq_sig_all = 1,
	};
	struct ibv_qp_attr attr = {
		.qp_state = IBV_QPS_INIT,
		.port_num = p->o.ib_port,
		.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ,
	};
	int i;

	p->nqp = n;
	for (i = 0; i < n; i++) {
		struct conn *c = &p->qp[i];

		c->cq = ibv_create_cq(p->ctx, 16, NULL, NULL, 0);
		if (!c->cq)
			fatal(p, "ibv_create_cq");
		init.send_cq = init.recv_cq = c->cq;
		c->qp = ibv_create_qp(p->pd, &init);
		if (!c->qp)
			fatal(p, "ibv_create_qp: %s", strerror(errno));
		if (ibv_modify_qp(c->qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
				  IBV_QP_ACCESS_FLAGS))
			fatal(p, "QP %d to INIT", i);
		c->psn = (uint32_t)(lrand48() & 0xffffff);
	}
}

static void connect_qp(struct peer *p, struct conn *c, uint32_t qpn, uint32_t psn,
		       const union ibv_gid *gid)
{
	struct ibv_qp_attr attr = {
		.qp_state = IBV_QPS_RTR,
		.path_mtu = mtu_enum(p, p->o.mtu),
		.dest_qp_num = qpn,
		.rq_psn = psn,
		.max_dest_rd_atomic = 1,
		.min_rnr_timer = 12,
		.ah_attr = {
			.is_global = 1,
			.grh = { .dgid = *gid, .sgid_index = p->o.gid_index, .hop_limit = 1 },
			.port_num = p->o.ib_port,
		},
	};

	if (ibv_modify_qp(c->qp, &attr, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
			  IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
			  IBV_QP_MIN_RNR_TIMER))
		fatal(p, "QP %#x to RTR", c->qp->qp_num);
	memset(&attr, 0, sizeof(attr));
	attr.qp_state = IBV_QPS_RTS;
	attr.timeout = 14;
	attr.retry_cnt = 7;
	attr.rnr_retry = 7;
	attr.sq_psn = c->psn;
	attr.max_rd_atomic = 1;
	if (ibv_modify_qp(c->qp, &attr, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
			  IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
		fatal(p, "QP %#x to RTS", c->qp->qp_num);
}

/* Both ends send "QP i qpn psn gid" for each of their QPs, then connect them. */
static void exchange_and_connect(struct peer *p)
{
	char line[256], hex[33];
	int i, j;

	for (i = 0; i < p->nqp; i++) {
		for (j = 0; j < 16; j++)
			sprintf(hex + 2 * j, "%02x", p->gid.raw[j]);
		ctl_send(p, "QP %d %06x %06x %s", i, p->qp[i].qp->qp_num, p->qp[i].psn, hex);
	}
	for (i = 0; i < p->nqp; i++) {
		union ibv_gid gid;
		unsigned int idx, qpn, psn, byte;

		ctl_recv(p, "QP", line, sizeof(line));
		if (sscanf(line, "QP %u %x %x %32s", &idx, &qpn, &psn, hex) != 4 ||
		    idx != (unsigned int)i || strlen(hex) != 32)
			fatal(p, "control connection: bad QP line %.80s", line);
		for (j = 0; j < 16; j++) {
			sscanf(hex + 2 * j, "%2x", &byte);
			gid.raw[j] = (uint8_t)byte;
		}
		connect_qp(p, &p->qp[i], qpn, psn, &gid);
		printf("mw_peer: QP %d: local %#x, remote %#x\n", i, p->qp[i].qp->qp_num, qpn);
	}
}

/* The next completion of QP i (its own CQ): its status, or -1 when none came in time. */
static int wait_wc(struct peer *p, int i, struct ibv_wc *wc)
{
	struct timespec t0, now, nap = { .tv_nsec = 20000 };
	int n;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		n = ibv_poll_cq(p->qp[i].cq, 1, wc);
		if (n < 0)
			fatal(p, "ibv_poll_cq: %d", n);
		if (n == 1)
			return wc->status;
		clock_gettime(CLOCK_MONOTONIC, &now);
		if (now.tv_sec - t0.tv_sec > WC_TIMEOUT_S) {
			memset(wc, 0, sizeof(*wc));
			return -1;
		}
		nanosleep(&nap, NULL);
	}
}

static void post_recv(struct peer *p, int i)
{
	struct ibv_sge sge = { (uintptr_t)p->msg, sizeof(p->msg), p->msg_mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = WRID_RECV, .sg_list = &sge, .num_sge = 1 }, *bad;

	if (ibv_post_recv(p->qp[i].qp, &wr, &bad))
		fatal(p, "ibv_post_recv on QP %d", i);
}

/* Posts one WR on QP i and waits for its completion; returns its status (-1: none). */
static int post_and_wait(struct peer *p, int i, struct ibv_send_wr *wr, struct ibv_wc *wc)
{
	struct ibv_send_wr *bad;
	int err = ibv_post_send(p->qp[i].qp, wr, &bad);

	if (err)
		fatal(p, "ibv_post_send (opcode %d) on QP %d: %s", wr->opcode, i, strerror(err));
	return wait_wc(p, i, wc);
}

/* The user's RDMA WRITE or READ of len bytes at remote addr through rkey, from / into
 * its buffer at offset local. */
static int rdma(struct peer *p, int i, enum ibv_wr_opcode op, size_t local, uint64_t len,
		uint64_t addr, uint32_t rkey)
{
	struct ibv_sge sge = { (uintptr_t)(p->buf + local), (uint32_t)len, p->mr->lkey };
	struct ibv_send_wr wr = {
		.wr_id = op == IBV_WR_RDMA_READ ? WRID_READ : WRID_WRITE,
		.sg_list = &sge, .num_sge = 1, .opcode = op,
		.wr = { .rdma = { .remote_addr = addr, .rkey = rkey } },
	};
	struct ibv_wc wc;

	return post_and_wait(p, i, &wr, &wc);
}

/* The user's SEND of SEND_LEN bytes, with invalidate_rkey when inv. */
static int send_msg(struct peer *p, int i, int inv, uint32_t rkey)
{
	struct ibv_sge sge = { (uintptr_t)p->msg, SEND_LEN, p->msg_mr->lkey };
	struct ibv_send_wr wr = {
		.wr_id = WRID_SEND, .sg_list = &sge, .num_sge = 1,
		.opcode = inv ? IBV_WR_SEND_WITH_INV : IBV_WR_SEND,
	};
	struct ibv_wc wc;

	memcpy(p->msg, "written", SEND_LEN);
	if (inv)
		wr.invalidate_rkey = rkey;
	return post_and_wait(p, i, &wr, &wc);
}

/* ---------------------------------------------------------------------------------- */
/* Bytes                                                                              */
/* ---------------------------------------------------------------------------------- */

/* Byte i of pattern seed: never GUARD, and different for seeds 1 and 2. */
static uint8_t pattern(int seed, size_t i)
{
	return (uint8_t)((i * 131u + (size_t)seed * 29u + 7u) % GUARD);
}

static void fill(uint8_t *b, size_t len, int seed)
{
	size_t i;

	for (i = 0; i < len; i++)
		b[i] = pattern(seed, i);
}

/* The binder's region holds pattern seed in the window (seed 0: GUARD there too) and
 * GUARD everywhere else. Writes the first difference into why; returns 1 if none. */
static int region_is(struct peer *p, int seed, char *why, size_t size)
{
	size_t i;

	for (i = 0; i < p->len; i++) {
		int in = i >= WIN_OFFSET && i < WIN_OFFSET + p->win_len;
		uint8_t want = in && seed ? pattern(seed, i - WIN_OFFSET) : GUARD;

		if (p->buf[i] != want) {
			snprintf(why, size, "byte %zu of the region (%s the window [%d, %" PRIu64
				 ")) is %#04x, wanted %#04x", i, in ? "inside" : "outside",
				 WIN_OFFSET, WIN_OFFSET + p->win_len, p->buf[i], want);
			return 0;
		}
	}
	snprintf(why, size, "window [%d, %" PRIu64 ") holds %s, the other %zu bytes of the "
		 "region untouched", WIN_OFFSET, WIN_OFFSET + p->win_len,
		 seed ? "the user's pattern" : "its guard bytes", p->len - p->win_len);
	return 1;
}

static void check_region(struct peer *p, const char *name, int seed)
{
	char why[200];
	int ok = region_is(p, seed, why, sizeof(why));

	check(p, ok, name, "%s", why);
}

/* ---------------------------------------------------------------------------------- */
/* The binder                                                                         */
/* ---------------------------------------------------------------------------------- */

/* Binds a type 2 window over the window range on QP i (IBV_WR_BIND_MW, the new R_Key
 * from ibv_inc_rkey), waits for the bind's completion, sends the window to the user and
 * returns its R_Key. */
static uint32_t bind_type2(struct peer *p, int i)
{
	struct ibv_wc wc;
	struct ibv_send_wr wr = { .wr_id = WRID_BIND, .opcode = IBV_WR_BIND_MW };
	uint64_t addr = (uintptr_t)(p->buf + WIN_OFFSET);
	uint32_t allocated, rkey;
	char name[32];
	int st, ok;

	p->mw[i] = ibv_alloc_mw(p->pd, IBV_MW_TYPE_2);
	if (!p->mw[i])
		fatal(p, "ibv_alloc_mw(IBV_MW_TYPE_2): %s", strerror(errno));
	allocated = p->mw[i]->rkey;
	rkey = ibv_inc_rkey(allocated);
	wr.bind_mw.mw = p->mw[i];
	wr.bind_mw.rkey = rkey;
	wr.bind_mw.bind_info.mr = p->mr;
	wr.bind_mw.bind_info.addr = addr;
	wr.bind_mw.bind_info.length = p->win_len;
	wr.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	st = post_and_wait(p, i, &wr, &wc);
	ok = st == IBV_WC_SUCCESS && wc.opcode == IBV_WC_BIND_MW;
	snprintf(name, sizeof(name), "bind_qp%d", i);
	check(p, ok, name, "IBV_WR_BIND_MW of a type 2 window, R_Key %#x (allocated %#x), over "
	      "[%#" PRIx64 ", +%" PRIu64 ") of the region [%p, +%zu), QP %#x: %s, %s",
	      rkey, allocated, addr, p->win_len, (void *)p->buf, p->len, p->qp[i].qp->qp_num,
	      status_name(st), opcode_name(wc.opcode));
	if (!ok)
		fatal(p, "no window to test");
	ctl_send(p, "WIN %d %" PRIx64 " %" PRIx64 " %x", i, addr, p->win_len, rkey);
	return rkey;
}

/* The receive completion of the user's SEND on QP 0: a plain SEND (inv 0) must not
 * carry IBV_WC_WITH_INV. For a SEND WITH INVALIDATE (inv 1) two checks: the completion
 * with inv_rkey in its invalidated_rkey, and (wc_with_inv) IBV_WC_WITH_INV in its
 * wc_flags, which ibv_poll_cq(3) says marks that field valid. */
static void check_send_received(struct peer *p, const char *name, int inv, uint32_t inv_rkey)
{
	struct ibv_wc wc;
	int st = wait_wc(p, 0, &wc), ok, with_inv = !!(wc.wc_flags & IBV_WC_WITH_INV);

	ok = st == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV && wc.byte_len == SEND_LEN;
	if (!inv) {
		check(p, ok && !with_inv, name, "%s, %s, %u bytes, wc_flags %#x (IBV_WC_WITH_INV "
		      "%s, wanted clear)", status_name(st), opcode_name(wc.opcode), wc.byte_len,
		      wc.wc_flags, with_inv ? "set" : "clear");
		return;
	}
	check(p, ok && wc.invalidated_rkey == inv_rkey, name, "%s, %s, %u bytes, invalidated "
	      "R_Key %#x (wanted %#x)", status_name(st), opcode_name(wc.opcode), wc.byte_len,
	      wc.invalidated_rkey, inv_rkey);
	check(p, st == IBV_WC_SUCCESS && with_inv, "wc_with_inv", "wc_flags %#x: IBV_WC_WITH_INV "
	      "(%#x) %s", wc.wc_flags, IBV_WC_WITH_INV, with_inv ? "set" : "clear, wanted set");
}

/* local_inv (inv_by_send 0) and send_inv (1). */
static void binder_invalidate(struct peer *p, int inv_by_send)
{
	struct ibv_send_wr wr = { .wr_id = WRID_INV, .opcode = IBV_WR_LOCAL_INV };
	struct ibv_wc wc;
	char line[128];
	uint32_t rkey = bind_type2(p, 0);
	int st;

	if (inv_by_send) {
		check_send_received(p, "send_with_inv_received", 1, rkey);
		check_region(p, "window_bytes", 1);
	} else {
		check_send_received(p, "send_received", 0, 0);
		check_region(p, "window_bytes", 1);
		wr.invalidate_rkey = rkey;
		st = post_and_wait(p, 0, &wr, &wc);
		check(p, st == IBV_WC_SUCCESS && wc.opcode == IBV_WC_LOCAL_INV, "local_inv",
		      "IBV_WR_LOCAL_INV of R_Key %#x: %s, %s", rkey, status_name(st),
		      opcode_name(wc.opcode));
	}
	ctl_send(p, "INVALIDATED");
	ctl_recv(p, "REFUSED", line, sizeof(line));
	check_region(p, "window_after_refused", 1);
}

static void binder_local_inv(struct peer *p)
{
	binder_invalidate(p, 0);
}

static void binder_send_inv(struct peer *p)
{
	binder_invalidate(p, 1);
}

/* bounds: a window on each QP. The user reports when its accesses are done, the
 * refused ones included. */
static void binder_bounds(struct peer *p)
{
	char line[128];

	bind_type2(p, 0);
	bind_type2(p, 1);
	ctl_recv(p, "REFUSED", line, sizeof(line));
	check_region(p, "window_after_refused", 1);
}

/* other_qp: one window, bound on QP 0. */
static void binder_other_qp(struct peer *p)
{
	char line[128];

	bind_type2(p, 0);
	ctl_recv(p, "REFUSED", line, sizeof(line));
	check_region(p, "window_after_refused", 1);
}

/* type1: ibv_bind_mw(3), then a bind of length 0 unbinds the window. */
static void binder_type1(struct peer *p)
{
	struct ibv_mw_bind b = {
		.wr_id = WRID_BIND,
		.send_flags = IBV_SEND_SIGNALED,
		.bind_info = {
			.mr = p->mr,
			.addr = (uintptr_t)(p->buf + WIN_OFFSET),
			.length = p->win_len,
			.mw_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ,
		},
	};
	struct ibv_wc wc;
	char line[128];
	uint32_t allocated, rkey;
	int err, st, ok;

	p->mw[0] = ibv_alloc_mw(p->pd, IBV_MW_TYPE_1);
	if (!p->mw[0])
		fatal(p, "ibv_alloc_mw(IBV_MW_TYPE_1): %s", strerror(errno));
	allocated = p->mw[0]->rkey;
	err = ibv_bind_mw(p->qp[0].qp, p->mw[0], &b);
	if (err)
		fatal(p, "ibv_bind_mw: %s", strerror(err));
	st = wait_wc(p, 0, &wc);
	rkey = p->mw[0]->rkey;
	ok = st == IBV_WC_SUCCESS && wc.opcode == IBV_WC_BIND_MW;
	check(p, ok, "bind_type1", "ibv_bind_mw of a type 1 window over [%#" PRIx64 ", +%"
	      PRIu64 "), R_Key %#x (allocated %#x), QP %#x: %s, %s", b.bind_info.addr,
	      p->win_len, rkey, allocated, p->qp[0].qp->qp_num, status_name(st),
	      opcode_name(wc.opcode));
	if (!ok)
		fatal(p, "no window to test");
	ctl_send(p, "WIN 0 %" PRIx64 " %" PRIx64 " %x", b.bind_info.addr, p->win_len, rkey);
	check_send_received(p, "send_received", 0, 0);
	check_region(p, "window_bytes", 1);
	b.bind_info.length = 0;
	b.bind_info.mw_access_flags = 0;
	err = ibv_bind_mw(p->qp[0].qp, p->mw[0], &b);
	if (err)
		fatal(p, "ibv_bind_mw (length 0): %s", strerror(err));
	st = wait_wc(p, 0, &wc);
	check(p, st == IBV_WC_SUCCESS && wc.opcode == IBV_WC_BIND_MW, "unbind_type1",
	      "ibv_bind_mw of length 0: %s, %s, R_Key now %#x", status_name(st),
	      opcode_name(wc.opcode), p->mw[0]->rkey);
	ctl_send(p, "INVALIDATED");
	ctl_recv(p, "REFUSED", line, sizeof(line));
	check_region(p, "window_after_refused", 1);
}

/* ---------------------------------------------------------------------------------- */
/* The user                                                                           */
/* ---------------------------------------------------------------------------------- */

static struct window recv_window(struct peer *p, int i)
{
	struct window w;
	char line[128];
	unsigned int idx;

	ctl_recv(p, "WIN", line, sizeof(line));
	if (sscanf(line, "WIN %u %" SCNx64 " %" SCNx64 " %x", &idx, &w.addr, &w.len, &w.rkey) != 4 ||
	    idx != (unsigned int)i || w.len != p->win_len)
		fatal(p, "control connection: bad WIN line %.80s", line);
	printf("mw_peer: window %d: [%#" PRIx64 ", +%" PRIu64 "), R_Key %#x\n", i, w.addr, w.len,
	       w.rkey);
	return w;
}

/* An access that must succeed: the WRITE of pattern seed over the whole window. */
static void user_write(struct peer *p, int i, const char *name, struct window w, int seed)
{
	int st;

	fill(p->buf, w.len, seed);
	st = rdma(p, i, IBV_WR_RDMA_WRITE, 0, w.len, w.addr, w.rkey);
	check(p, st == IBV_WC_SUCCESS, name, "RDMA WRITE of %" PRIu64 " bytes to [%#" PRIx64
	      ", +%" PRIu64 ") through R_Key %#x on QP %#x: %s", w.len, w.addr, w.len, w.rkey,
	      p->qp[i].qp->qp_num, status_name(st));
}

/* The READ of the whole window must return pattern seed. */
static void user_read(struct peer *p, int i, const char *name, struct window w, int seed)
{
	size_t k, bad = w.len;
	int st;

	memset(p->buf + w.len, GUARD, w.len);
	st = rdma(p, i, IBV_WR_RDMA_READ, w.len, w.len, w.addr, w.rkey);
	for (k = 0; k < w.len && bad == w.len; k++)
		if (p->buf[w.len + k] != pattern(seed, k))
			bad = k;
	if (st == IBV_WC_SUCCESS && bad < w.len)
		check(p, 0, name, "RDMA READ of the window: byte %zu is %#04x, wanted %#04x", bad,
		      p->buf[w.len + bad], pattern(seed, bad));
	else
		check(p, st == IBV_WC_SUCCESS, name, "RDMA READ of %" PRIu64 " bytes from [%#"
		      PRIx64 ", +%" PRIu64 ") through R_Key %#x: %s%s", w.len, w.addr, w.len,
		      w.rkey, status_name(st), st == IBV_WC_SUCCESS ? ", every byte as written" : "");
}

/* An access that must be refused: IBV_WC_REM_ACCESS_ERR (IBTA: a remote access through
 * an R_Key that does not grant it completes with a Remote Access Error). */
static void user_refused(struct peer *p, int i, const char *name, enum ibv_wr_opcode op,
			 uint64_t addr, uint64_t len, uint32_t rkey, const char *what)
{
	int st;

	fill(p->buf, len, 2);
	st = rdma(p, i, op, 0, len, addr, rkey);
	check(p, st == IBV_WC_REM_ACCESS_ERR, name, "RDMA %s of %" PRIu64 " bytes at %#" PRIx64
	      " through R_Key %#x (%s) on QP %#x: %s, wanted %s", op == IBV_WR_RDMA_READ ?
	      "READ" : "WRITE", len, addr, rkey, what, p->qp[i].qp->qp_num, status_name(st),
	      ibv_wc_status_str(IBV_WC_REM_ACCESS_ERR));
}

/* local_inv, send_inv, type1: WRITE, READ back, SEND (send_inv: with invalidate); once
 * the binder has invalidated or unbound the window, a WRITE through the old R_Key. */
static void user_invalidated(struct peer *p)
{
	struct window w = recv_window(p, 0);
	char line[64];
	int inv = !strcmp(p->o.test, "send_inv"), st;
	const char *after = strcmp(p->o.test, "type1") ? "write_after_invalidate" :
		"write_after_unbind";

	user_write(p, 0, "write", w, 1);
	user_read(p, 0, "read", w, 1);
	st = send_msg(p, 0, inv, w.rkey);
	if (inv)
		check(p, st == IBV_WC_SUCCESS, "send_with_inv", "IBV_WR_SEND_WITH_INV of R_Key %#x: %s",
		      w.rkey, status_name(st));
	else
		check(p, st == IBV_WC_SUCCESS, "send", "IBV_WR_SEND: %s", status_name(st));
	ctl_recv(p, "INVALIDATED", line, sizeof(line));
	user_refused(p, 0, after, IBV_WR_RDMA_WRITE, w.addr, w.len, w.rkey,
		     !strcmp(p->o.test, "type1") ? "the window was unbound" :
		     "the window was invalidated");
	ctl_send(p, "REFUSED");
}

static void user_bounds(struct peer *p)
{
	struct window w0 = recv_window(p, 0), w1 = recv_window(p, 1);

	user_write(p, 0, "write", w0, 1);
	user_refused(p, 0, "write_past_window_end", IBV_WR_RDMA_WRITE, w0.addr + w0.len - PROBE / 2,
		     PROBE, w0.rkey, "its last 8 bytes past the window's end, inside the region");
	user_refused(p, 1, "read_before_window_start", IBV_WR_RDMA_READ, w1.addr - PROBE / 2,
		     PROBE, w1.rkey, "its first 8 bytes before the window's start, inside the region");
	ctl_send(p, "REFUSED");
}

static void user_other_qp(struct peer *p)
{
	struct window w = recv_window(p, 0);

	user_write(p, 0, "write", w, 1);
	user_refused(p, 1, "write_through_other_qp", IBV_WR_RDMA_WRITE, w.addr, w.len, w.rkey,
		     "a type 2 window bound on the peer's other QP");
	ctl_send(p, "REFUSED");
}

/* ---------------------------------------------------------------------------------- */

struct test {
	const char *name;
	int nqp;
	void (*binder)(struct peer *);
	void (*user)(struct peer *);
};

static const struct test TESTS[] = {
	{ "local_inv", 1, binder_local_inv, user_invalidated },
	{ "send_inv", 1, binder_send_inv, user_invalidated },
	{ "bounds", 2, binder_bounds, user_bounds },
	{ "other_qp", 2, binder_other_qp, user_other_qp },
	{ "type1", 1, binder_type1, user_invalidated },
};

static void teardown(struct peer *p)
{
	int i, err = 0;
	char what[128] = "";

#define TRY(call)                                                                      \
	do {                                                                           \
		int e_ = (call);                                                       \
		if (e_ && !err) {                                                      \
			err = e_;                                                      \
			snprintf(what, sizeof(what), "%s: %s", #call, strerror(e_));   \
		}                                                                      \
	} while (0)
	for (i = 0; i < MAX_QPS; i++)
		if (p->mw[i])
			TRY(ibv_dealloc_mw(p->mw[i]));
	for (i = 0; i < p->nqp; i++) {
		TRY(ibv_destroy_qp(p->qp[i].qp));
		TRY(ibv_destroy_cq(p->qp[i].cq));
	}
	TRY(ibv_dereg_mr(p->mr));
	TRY(ibv_dereg_mr(p->msg_mr));
	TRY(ibv_dealloc_pd(p->pd));
	TRY(ibv_close_device(p->ctx));
#undef TRY
	check(p, !err, "teardown", "%s", err ? what :
	      "windows deallocated, QPs, CQs, regions, PD and device closed");
}

static void usage(void)
{
	fprintf(stderr, "usage: mw_peer -t TEST [-d DEV] [-i IB_PORT] -g GID_INDEX [-p TCP_PORT]"
		" [-m MTU] [HOST]\n  TEST: local_inv, send_inv, bounds, other_qp, type1\n"
		"  without HOST: the binder (listens); with HOST: the user (connects)\n");
	exit(2);
}

int main(int argc, char **argv)
{
	struct peer p = { .o = { .ib_port = 1, .gid_index = -1, .tcp_port = 18515, .mtu = 1024 } };
	const struct test *t = NULL;
	size_t k;
	int c;

	while ((c = getopt(argc, argv, "d:i:g:p:m:t:")) != -1) {
		switch (c) {
		case 'd': p.o.dev = optarg; break;
		case 'i': p.o.ib_port = atoi(optarg); break;
		case 'g': p.o.gid_index = atoi(optarg); break;
		case 'p': p.o.tcp_port = atoi(optarg); break;
		case 'm': p.o.mtu = atoi(optarg); break;
		case 't': p.o.test = optarg; break;
		default: usage();
		}
	}
	if (optind == argc - 1)
		p.o.server = argv[optind];
	else if (optind != argc)
		usage();
	for (k = 0; k < sizeof(TESTS) / sizeof(TESTS[0]); k++)
		if (p.o.test && !strcmp(p.o.test, TESTS[k].name))
			t = &TESTS[k];
	if (!t || p.o.gid_index < 0)
		usage();
	p.binder = !p.o.server;
	setvbuf(stdout, NULL, _IOLBF, 0);
	srand48((long)getpid() ^ (long)time(NULL));
	printf("mw_peer: %s, test %s, path MTU %d, GID index %d\n",
	       p.binder ? "binder" : "user", t->name, p.o.mtu, p.o.gid_index);

	open_device(&p);
	register_memory(&p);
	create_qps(&p, t->nqp);
	if (p.binder)
		post_recv(&p, 0);
	ctl_open(&p);
	exchange_and_connect(&p);
	(p.binder ? t->binder : t->user)(&p);
	teardown(&p);
	printf("mw_peer: %s: %d checks, %s\n", p.binder ? "binder" : "user", p.checks,
	       p.failed ? "FAILED" : "all passed");
	if (p.failed)
		printf("mw_peer: %d of %d checks FAILED\n", p.failed, p.checks);
	fclose(p.ctl);
	return p.failed ? 1 : 0;
}
