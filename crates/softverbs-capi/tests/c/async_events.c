/*
 * Asynchronous events and their acknowledgement on the drop-in, through the real
 * functions (ibv_get_async_event, ibv_ack_async_event, ibv_destroy_qp / _srq / _cq).
 * ibv_get_async_event(3): "All async events that ibv_get_async_event() returns must be
 * acknowledged using ibv_ack_async_event(). To avoid races, destroying an object (CQ, SRQ
 * or QP) will wait for all affiliated events for the object to be acknowledged."
 *
 *   1 a responder's remote access error raises IBV_EVENT_QP_ACCESS_ERR naming the
 *     responder QP; its events_completed counts the acknowledgement; and
 *     ibv_destroy_qp of a QP with a delivered, unacknowledged event waits (still blocked
 *     after QUIET_MS) until ibv_ack_async_event, then returns 0
 *   2 an event of a QP destroyed before the event was read is never delivered (as the
 *     kernel drops a destroyed object's unread events): no event names freed memory
 *   3 IBV_EVENT_SRQ_LIMIT_REACHED names the SRQ, and ibv_destroy_srq waits for its
 *     acknowledgement the same way
 *   4 IBV_EVENT_CQ_ERR (an overrun CQ) names the CQ, and ibv_destroy_cq waits for its
 *     acknowledgement the same way
 *
 * Prints one "rule N ... ok" line per rule and "ok <checks> checks" at the end; exits 1
 * with "FAIL rule N (...)" on stderr at the first failed check. Every wait is bounded, and
 * a watchdog alarm ends the program naming the rule if a call blocks. Everything is freed.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <infiniband/verbs.h>

#include "rules.h"

static void rule_ok(const char *what)
{
	alarm(0);
	printf("rule %s: %s: ok\n", rule, what);
	fflush(stdout);
}

#define REGION 8192
#define LEN 64

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_mr *mr;
static char *buf;
static union ibv_gid gid;

/* ------------------------------------------------------------------ async events */

/*
 * The next async event within timeout_ms (async_fd is non-blocking): 1 and *ev, or 0 if
 * none came.
 */
static int next_event(struct ibv_async_event *ev, int timeout_ms)
{
	int64_t deadline = now_ms() + timeout_ms;
	for (int iter = 0; iter < MAX_ITERS; iter++) {
		if (ibv_get_async_event(ctx, ev) == 0)
			return 1;
		CHECKF(errno == EAGAIN, "ibv_get_async_event: errno %d, expected EAGAIN", errno);
		int64_t left = deadline - now_ms();
		if (left <= 0)
			return 0;
		struct pollfd p = { .fd = ctx->async_fd, .events = POLLIN };
		poll(&p, 1, (int)(left < 50 ? left : 50));
	}
	return 0;
}

/* The next event of `type` within WAIT_MS, acknowledging the others on the way. */
static struct ibv_async_event expect_event(enum ibv_event_type type)
{
	struct ibv_async_event ev;
	for (int i = 0; i < 64; i++) {
		CHECKF(next_event(&ev, WAIT_MS), "no %s within %d ms", ibv_event_type_str(type),
		       WAIT_MS);
		if (ev.event_type == type)
			return ev;
		ibv_ack_async_event(&ev);
	}
	FAIL("no %s among 64 events", ibv_event_type_str(type));
	return ev;
}

/* Takes and acknowledges every queued event; fails if one names `qp`. */
static void drain_events(const void *qp)
{
	struct ibv_async_event ev;
	for (int i = 0; i < 64 && next_event(&ev, QUIET_MS); i++) {
		int names_qp = ev.event_type != IBV_EVENT_CQ_ERR &&
			       ev.event_type != IBV_EVENT_SRQ_LIMIT_REACHED &&
			       ev.event_type != IBV_EVENT_SRQ_ERR &&
			       ev.event_type != IBV_EVENT_PORT_ACTIVE &&
			       ev.event_type != IBV_EVENT_PORT_ERR &&
			       ev.event_type != IBV_EVENT_DEVICE_FATAL;
		CHECKF(!(names_qp && (const void *)ev.element.qp == qp),
		       "%s names QP %p, destroyed before the event was read",
		       ibv_event_type_str(ev.event_type), qp);
		CHECKF(!(names_qp && ev.element.qp == NULL), "%s names no QP",
		       ibv_event_type_str(ev.event_type));
		ibv_ack_async_event(&ev);
	}
}

/* ------------------------------------------------------------------ destroy on a thread */

enum kind { QP, SRQ, CQ };

struct destroyer {
	pthread_t thread;
	enum kind kind;
	void *object;
	int rc;
	volatile int done;
};

static void *destroy_main(void *arg)
{
	struct destroyer *d = arg;
	switch (d->kind) {
	case QP:
		d->rc = ibv_destroy_qp(d->object);
		break;
	case SRQ:
		d->rc = ibv_destroy_srq(d->object);
		break;
	case CQ:
		d->rc = ibv_destroy_cq(d->object);
		break;
	}
	__atomic_store_n(&d->done, 1, __ATOMIC_RELEASE);
	return NULL;
}

/* Whether the destroy returned within timeout_ms. */
static int destroy_done_within(struct destroyer *d, int timeout_ms)
{
	int64_t deadline = now_ms() + timeout_ms;
	for (int iter = 0; iter < MAX_ITERS; iter++) {
		if (__atomic_load_n(&d->done, __ATOMIC_ACQUIRE))
			return 1;
		if (now_ms() >= deadline)
			return 0;
		usleep(1000);
	}
	return 0;
}

/*
 * The rule's core: with `ev` (naming `object`) delivered and not acknowledged, the
 * destroy of `object` on another thread must still be waiting after QUIET_MS; once `ev`
 * is acknowledged it must return 0 within WAIT_MS.
 */
static void destroy_waits_for_ack(enum kind kind, void *object, struct ibv_async_event *ev)
{
	struct destroyer d = { .kind = kind, .object = object, .rc = -1, .done = 0 };
	CHECK(pthread_create(&d.thread, NULL, destroy_main, &d) == 0);
	int early = destroy_done_within(&d, QUIET_MS);
	if (early) {
		pthread_join(d.thread, NULL);
		FAIL("the destroy returned %d while an event of the object was unacknowledged",
		     d.rc);
	}
	ibv_ack_async_event(ev);
	CHECKF(destroy_done_within(&d, WAIT_MS),
	       "the destroy did not return within %d ms of the acknowledgement", WAIT_MS);
	CHECK(pthread_join(d.thread, NULL) == 0);
	CHECKF(d.rc == 0, "the destroy returned %d", d.rc);
}

/* ------------------------------------------------------------------ QPs */

static struct ibv_qp *create_rc(struct ibv_cq *cq, struct ibv_srq *srq)
{
	struct ibv_qp_init_attr attr = {
		.send_cq = cq,
		.recv_cq = cq,
		.srq = srq,
		.cap = { .max_send_wr = 8, .max_recv_wr = srq ? 0 : 8, .max_send_sge = 1,
			 .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
		.sq_sig_all = 1,
	};
	struct ibv_qp *qp = ibv_create_qp(pd, &attr);
	CHECKF(qp != NULL, "ibv_create_qp(RC)");
	return qp;
}

struct pair {
	struct ibv_qp *req, *resp;
	struct ibv_cq *req_cq, *resp_cq;
};

/* Two connected RC QPs, each with its own CQ; the responder receives from `srq` if any. */
static struct pair make_pair(struct ibv_srq *srq)
{
	struct pair p;
	p.req_cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	p.resp_cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	CHECK(p.req_cq != NULL && p.resp_cq != NULL);
	p.req = create_rc(p.req_cq, NULL);
	p.resp = create_rc(p.resp_cq, srq);
	connect_rc(p.req, p.resp->qp_num, &gid, IBV_ACCESS_REMOTE_WRITE);
	connect_rc(p.resp, p.req->qp_num, &gid, IBV_ACCESS_REMOTE_WRITE);
	return p;
}

static void free_cqs(struct pair p)
{
	CHECK(ibv_destroy_cq(p.req_cq) == 0);
	CHECK(ibv_destroy_cq(p.resp_cq) == 0);
}

static void post(struct ibv_qp *qp, uint64_t wr_id, enum ibv_wr_opcode opcode, uint32_t rkey)
{
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = LEN, .lkey = mr->lkey };
	struct ibv_send_wr wr = {
		.wr_id = wr_id,
		.sg_list = &sge,
		.num_sge = 1,
		.opcode = opcode,
		.send_flags = IBV_SEND_SIGNALED,
	};
	wr.wr.rdma.remote_addr = (uintptr_t)buf + 4096;
	wr.wr.rdma.rkey = rkey;
	struct ibv_send_wr *bad = NULL;
	CHECKF(ibv_post_send(qp, &wr, &bad) == 0, "ibv_post_send");
}

/* An RDMA WRITE naming an rkey that does not exist: the requester completes with
 * IBV_WC_REM_ACCESS_ERR, the responder QP goes to error. */
static void bad_rkey_write(struct pair p)
{
	post(p.req, 1, IBV_WR_RDMA_WRITE, mr->rkey ^ 0x5a5a00);
	struct ibv_wc wc;
	CHECKF(poll_until(p.req_cq, 1, &wc, WAIT_MS) == 1, "no completion for the write");
	CHECKF(wc.status == IBV_WC_REM_ACCESS_ERR, "status %s, expected REM_ACCESS_ERR",
	       ibv_wc_status_str(wc.status));
}

/* ------------------------------------------------------------------ the rules */

static void rule_qp(void)
{
	struct pair p = make_pair(NULL);

	start_rule("1");
	bad_rkey_write(p);
	struct ibv_async_event ev = expect_event(IBV_EVENT_QP_ACCESS_ERR);
	CHECKF(ev.element.qp == p.resp, "IBV_EVENT_QP_ACCESS_ERR names QP %p, expected %p",
	       (void *)ev.element.qp, (void *)p.resp);
	CHECKF(p.resp->events_completed == 0, "events_completed %u before the ack",
	       p.resp->events_completed);
	/* An acknowledgement is counted in the object's events_completed. */
	struct ibv_qp *resp = p.resp;
	destroy_waits_for_ack(QP, resp, &ev);
	CHECK(ibv_destroy_qp(p.req) == 0);
	free_cqs(p);
	rule_ok("IBV_EVENT_QP_ACCESS_ERR names the QP; ibv_destroy_qp waits for its ack");
}

static void rule_events_completed(void)
{
	struct pair p = make_pair(NULL);

	start_rule("1b");
	bad_rkey_write(p);
	struct ibv_async_event ev = expect_event(IBV_EVENT_QP_ACCESS_ERR);
	CHECK(ev.element.qp == p.resp);
	ibv_ack_async_event(&ev);
	CHECKF(p.resp->events_completed == 1, "events_completed %u after one ack",
	       p.resp->events_completed);
	CHECK(ibv_destroy_qp(p.resp) == 0);
	CHECK(ibv_destroy_qp(p.req) == 0);
	free_cqs(p);
	rule_ok("an acknowledged event is counted in the QP's events_completed");
}

static void rule_destroyed_before_read(void)
{
	struct pair p = make_pair(NULL);

	start_rule("2");
	drain_events(NULL);
	bad_rkey_write(p);
	/* The responder's event is queued by now (it failed before the NAK left); give the
	 * device a moment more, then destroy the QP without reading the event. */
	usleep(QUIET_MS * 1000);
	void *gone = p.resp;
	CHECK(ibv_destroy_qp(p.resp) == 0);
	drain_events(gone);
	CHECK(ibv_destroy_qp(p.req) == 0);
	free_cqs(p);
	rule_ok("an event of a QP destroyed before it was read is not delivered");
}

static void rule_srq(void)
{
	struct ibv_srq_init_attr init = { .attr = { .max_wr = 8, .max_sge = 1 } };
	struct ibv_srq *srq = ibv_create_srq(pd, &init);
	CHECKF(srq != NULL, "ibv_create_srq");
	struct pair p = make_pair(srq);

	start_rule("3");
	for (int i = 0; i < 4; i++) {
		struct ibv_sge sge = { .addr = (uintptr_t)buf + 4096, .length = LEN,
				       .lkey = mr->lkey };
		struct ibv_recv_wr wr = { .wr_id = 100 + i, .sg_list = &sge, .num_sge = 1 };
		struct ibv_recv_wr *bad = NULL;
		CHECK(ibv_post_srq_recv(srq, &wr, &bad) == 0);
	}
	struct ibv_srq_attr attr = { .srq_limit = 3 };
	CHECK(ibv_modify_srq(srq, &attr, IBV_SRQ_LIMIT) == 0);
	post(p.req, 2, IBV_WR_SEND, 0);
	post(p.req, 3, IBV_WR_SEND, 0);
	struct ibv_wc wc[2];
	CHECKF(poll_until(p.req_cq, 2, wc, WAIT_MS) == 2, "the sends did not complete");
	CHECKF(poll_until(p.resp_cq, 2, wc, WAIT_MS) == 2, "the receives did not complete");
	struct ibv_async_event ev = expect_event(IBV_EVENT_SRQ_LIMIT_REACHED);
	CHECKF(ev.element.srq == srq, "IBV_EVENT_SRQ_LIMIT_REACHED names SRQ %p, expected %p",
	       (void *)ev.element.srq, (void *)srq);
	CHECK(ibv_destroy_qp(p.resp) == 0);
	CHECK(ibv_destroy_qp(p.req) == 0);
	destroy_waits_for_ack(SRQ, srq, &ev);
	free_cqs(p);
	rule_ok("IBV_EVENT_SRQ_LIMIT_REACHED names the SRQ; ibv_destroy_srq waits for its ack");
}

static void rule_cq(void)
{
	/* A CQ of 1 entry (the device may round up) overrun by more sends than it holds. */
	struct ibv_cq *small = ibv_create_cq(ctx, 1, NULL, NULL, 0);
	CHECK(small != NULL);
	int room = small->cqe;
	struct ibv_cq *resp_cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	CHECK(resp_cq != NULL);
	struct ibv_qp *req = create_rc(small, NULL);
	struct ibv_qp *resp = create_rc(resp_cq, NULL);
	connect_rc(req, resp->qp_num, &gid, IBV_ACCESS_REMOTE_WRITE);
	connect_rc(resp, req->qp_num, &gid, IBV_ACCESS_REMOTE_WRITE);

	start_rule("4");
	CHECKF(room < 8, "a CQ of 1 got %d entries", room);
	for (int i = 0; i <= room; i++)
		post(req, 10 + i, IBV_WR_RDMA_WRITE, mr->rkey);
	struct ibv_async_event ev = expect_event(IBV_EVENT_CQ_ERR);
	CHECKF(ev.element.cq == small, "IBV_EVENT_CQ_ERR names CQ %p, expected %p",
	       (void *)ev.element.cq, (void *)small);
	CHECK(ibv_destroy_qp(req) == 0);
	CHECK(ibv_destroy_qp(resp) == 0);
	destroy_waits_for_ack(CQ, small, &ev);
	CHECK(ibv_destroy_cq(resp_cq) == 0);
	rule_ok("IBV_EVENT_CQ_ERR names the CQ; ibv_destroy_cq waits for its ack");
}

int main(void)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	signal(SIGALRM, watchdog);
	start_rule("setup");
	ctx = open_softverbs0();
	CHECK(ibv_query_gid(ctx, 1, 0, &gid) == 0);
	int flags = fcntl(ctx->async_fd, F_GETFL);
	CHECK(flags >= 0 && fcntl(ctx->async_fd, F_SETFL, flags | O_NONBLOCK) == 0);
	pd = ibv_alloc_pd(ctx);
	CHECK(pd != NULL);
	buf = aligned_alloc(4096, REGION);
	CHECK(buf != NULL);
	memset(buf, 0x11, REGION);
	mr = ibv_reg_mr(pd, buf, REGION, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	CHECK(mr != NULL);
	rule_ok("device, PD, region; async_fd non-blocking");
	rule_qp();
	rule_events_completed();
	rule_destroyed_before_read();
	rule_srq();
	rule_cq();
	start_rule("teardown");
	drain_events(NULL);
	CHECK(ibv_dereg_mr(mr) == 0);
	free(buf);
	CHECK(ibv_dealloc_pd(pd) == 0);
	CHECK(ibv_close_device(ctx) == 0);
	rule_ok("everything freed");
	printf("ok %d checks\n", checks);
	return 0;
}
