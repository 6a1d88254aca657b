/*
 * Completion-queue rules the pingpong programs never reach, checked against the drop-in
 * with completions the program makes itself: two RC QPs of the one device
 * (softverbs0), connected to each other through it (RoCEv2 address = GID index 0), send
 * to each other. Each rule is its own function and cites the man page it pins.
 *
 *   1 CQ overrun: the CQ goes to error, ibv_poll_cq < 0, IBV_EVENT_CQ_ERR names the CQ
 *   2 IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN: no error, no CQ_ERR, polling keeps working
 *   3 solicited-only arming: unsolicited receives raise no event, solicited ones and
 *     unsuccessful completions do
 *   4 arming is one-shot
 *   5 non-blocking channel (and async) fds: poll()able, EAGAIN when empty
 *   6 ibv_destroy_cq (and ibv_destroy_comp_channel) refuse with EBUSY while in use
 *   7 ibv_resize_cq keeps every outstanding completion, in order
 *   8 ibv_create_cq_ex with a completion timestamp: start/next/end_poll and the readers
 *   9 events acknowledged before ibv_destroy_cq; destroy waits for the acks
 *
 * Prints one "rule N ... ok" line per rule and "ok <checks> checks" at the end; exits 1
 * with "FAIL rule N (...)" on stderr at the first failed check. Every wait is bounded
 * (a deadline and an iteration count), and a watchdog alarm ends the program naming the
 * rule if a call blocks (ibv_destroy_cq waiting for acknowledgements, for instance).
 * Everything is freed, so leak checkers have nothing to report.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <infiniband/verbs.h>

#include "rules.h"

static void rule_ok(void)
{
	alarm(0);
	printf("rule %s: ok\n", rule);
	fflush(stdout);
}

/* ------------------------------------------------------------------ time, waits */

static void set_nonblocking(int fd)
{
	int flags = fcntl(fd, F_GETFL);
	CHECKF(flags >= 0 && fcntl(fd, F_SETFL, flags | O_NONBLOCK) == 0, "fcntl(O_NONBLOCK) on fd %d",
	       fd);
}

/* 1 if fd becomes readable within timeout_ms, else 0 (poll(2) on a pollable fd). */
static int fd_readable(int fd, int timeout_ms)
{
	int64_t deadline = now_ms() + timeout_ms;
	for (int iter = 0; iter < MAX_ITERS; iter++) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		int64_t left = deadline - now_ms();
		int rc = poll(&p, 1, left > 0 ? (int)left : 0);
		if (rc < 0 && errno == EINTR)
			continue;
		CHECKF(rc >= 0, "poll() on fd %d failed", fd);
		if (rc > 0) {
			CHECKF(p.revents & POLLIN, "poll() on fd %d: revents 0x%x without POLLIN", fd,
			       p.revents);
			return 1;
		}
		if (now_ms() >= deadline)
			return 0;
	}
	return 0;
}

/* Polls the completions of one QP's signalled sends: all must succeed, in order. */
static void expect_sends(struct ibv_cq *cq, int n, uint64_t first_wr_id, uint32_t qp_num)
{
	struct ibv_wc wc[64];
	CHECK(n <= 64);
	int got = poll_until(cq, n, wc, WAIT_MS);
	CHECKF(got == n, "expected %d send completions, ibv_poll_cq gave %d", n, got);
	for (int i = 0; i < n; i++) {
		CHECKF(wc[i].status == IBV_WC_SUCCESS, "send %d: status %s", i,
		       ibv_wc_status_str(wc[i].status));
		CHECKF(wc[i].opcode == IBV_WC_SEND, "send %d: opcode %d", i, wc[i].opcode);
		CHECKF(wc[i].wr_id == first_wr_id + (uint64_t)i,
		       "send %d: wr_id %" PRIu64 ", expected %" PRIu64, i, wc[i].wr_id,
		       first_wr_id + (uint64_t)i);
		CHECKF(wc[i].qp_num == qp_num, "send %d: qp_num %u, expected %u", i, wc[i].qp_num,
		       qp_num);
	}
}

/* ------------------------------------------------------------------ the device */

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_mr *mr;
static char *buf;
static union ibv_gid gid;
static struct ibv_device_attr dev_attr;

#define BUF_SIZE (1u << 20)
#define SLOT 256u
#define SLOTS (BUF_SIZE / 2 / SLOT)
/* Sends read from the first half of the buffer, receives land in the second. */
#define SEND_AREA(i) (buf + ((i) % SLOTS) * SLOT)
#define RECV_AREA(i) (buf + BUF_SIZE / 2 + ((i) % SLOTS) * SLOT)

static void open_device(void)
{
	ctx = open_softverbs0();
	CHECK(ibv_query_device(ctx, &dev_attr) == 0);
	CHECK(ibv_query_gid(ctx, 1, 0, &gid) == 0);
	pd = ibv_alloc_pd(ctx);
	CHECK(pd != NULL);
	buf = aligned_alloc(4096, BUF_SIZE);
	CHECK(buf != NULL);
	memset(buf, 0, BUF_SIZE);
	for (unsigned i = 0; i < BUF_SIZE / 2; i++)
		buf[i] = (char)(i * 7 + 1);
	mr = ibv_reg_mr(pd, buf, BUF_SIZE, IBV_ACCESS_LOCAL_WRITE);
	CHECKF(mr != NULL, "ibv_reg_mr");
	/* Async events are read without blocking (ibv_get_async_event(3), non-blocking
	 * example): every wait for one is a bounded poll() on async_fd. */
	CHECK(ctx->async_fd >= 0);
	set_nonblocking(ctx->async_fd);
}

static void close_device(void)
{
	CHECK(ibv_dereg_mr(mr) == 0);
	free(buf);
	CHECK(ibv_dealloc_pd(pd) == 0);
	CHECK(ibv_close_device(ctx) == 0);
}

static struct ibv_cq *create_cq(int cqe, void *cq_context, struct ibv_comp_channel *channel)
{
	struct ibv_cq *cq = ibv_create_cq(ctx, cqe, cq_context, channel, 0);
	CHECKF(cq != NULL, "ibv_create_cq(cqe %d)", cqe);
	CHECKF(cq->cqe >= cqe, "ibv_create_cq(cqe %d) made cq->cqe %d", cqe, cq->cqe);
	return cq;
}

static struct ibv_qp *create_rc(struct ibv_cq *send_cq, struct ibv_cq *recv_cq, uint32_t depth)
{
	CHECKF(depth <= (uint32_t)dev_attr.max_qp_wr, "queue depth %u above max_qp_wr %d", depth,
	       dev_attr.max_qp_wr);
	struct ibv_qp_init_attr attr = {
		.send_cq = send_cq,
		.recv_cq = recv_cq,
		.cap = { .max_send_wr = depth, .max_recv_wr = depth, .max_send_sge = 1,
			 .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
	};
	struct ibv_qp *qp = ibv_create_qp(pd, &attr);
	CHECKF(qp != NULL, "ibv_create_qp(RC, depth %u)", depth);
	return qp;
}

/* RESET -> INIT -> RTR -> RTS towards `remote` (a QP of the same device). */
static void connect_qp(struct ibv_qp *qp, uint32_t remote)
{
	connect_rc(qp, remote, &gid, 0);
}

/* Two connected RC QPs: a sends, b receives. */
struct pair {
	struct ibv_qp *a, *b;
};

static struct pair make_pair(struct ibv_cq *a_send, struct ibv_cq *a_recv, struct ibv_cq *b_send,
			     struct ibv_cq *b_recv, uint32_t depth)
{
	struct pair p = { create_rc(a_send, a_recv, depth), create_rc(b_send, b_recv, depth) };
	connect_qp(p.a, p.b->qp_num);
	connect_qp(p.b, p.a->qp_num);
	return p;
}

static void destroy_pair(struct pair p)
{
	CHECK(ibv_destroy_qp(p.a) == 0);
	CHECK(ibv_destroy_qp(p.b) == 0);
}

static uint32_t next_slot;

static void post_recvs(struct ibv_qp *qp, uint64_t first_wr_id, int n)
{
	for (int i = 0; i < n; i++) {
		uint32_t slot = next_slot++;
		struct ibv_sge sge = { .addr = (uintptr_t)RECV_AREA(slot), .length = SLOT,
				       .lkey = mr->lkey };
		struct ibv_recv_wr wr = { .wr_id = first_wr_id + (uint64_t)i, .sg_list = &sge,
					  .num_sge = 1 };
		struct ibv_recv_wr *bad = NULL;
		CHECKF(ibv_post_recv(qp, &wr, &bad) == 0, "ibv_post_recv %d of %d", i, n);
	}
}

static void post_send(struct ibv_qp *qp, uint64_t wr_id, uint32_t len, unsigned flags)
{
	struct ibv_sge sge = { .addr = (uintptr_t)SEND_AREA(wr_id), .length = len, .lkey = mr->lkey };
	struct ibv_send_wr wr = { .wr_id = wr_id, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED | flags };
	struct ibv_send_wr *bad = NULL;
	CHECKF(ibv_post_send(qp, &wr, &bad) == 0, "ibv_post_send wr_id %" PRIu64, wr_id);
}

/* Sends n messages a -> b, wr_ids first..first+n-1, and waits for their (successful, in
 * order) send completions on send_cq: an RC send completes once the receiver has
 * acknowledged it, so the receive completions exist by then. */
static void send_and_wait(struct pair p, struct ibv_cq *send_cq, uint64_t first, int n,
			  unsigned flags)
{
	for (int i = 0; i < n; i++)
		post_send(p.a, first + (uint64_t)i, 64, flags);
	for (int done = 0; done < n;) {
		int chunk = n - done > 64 ? 64 : n - done;
		expect_sends(send_cq, chunk, first + (uint64_t)done, p.a->qp_num);
		done += chunk;
	}
}

/*
 * Reads async events for up to timeout_ms (without blocking: async_fd is non-blocking),
 * acknowledging each (ibv_get_async_event(3): "All async events that
 * ibv_get_async_event() returns must be acknowledged using ibv_ack_async_event()").
 * Returns how many IBV_EVENT_CQ_ERR events named `cq`; stops at the first one when
 * stop_at_first. A CQ_ERR naming another CQ is a failure (only `cq` may overrun here).
 */
static int cq_err_events(struct ibv_cq *cq, int timeout_ms, int stop_at_first)
{
	int found = 0;
	int64_t deadline = now_ms() + timeout_ms;
	for (int iter = 0; iter < MAX_ITERS; iter++) {
		int64_t left = deadline - now_ms();
		if (left < 0)
			break;
		if (!fd_readable(ctx->async_fd, (int)left))
			break;
		struct ibv_async_event ev;
		memset(&ev, 0, sizeof(ev));
		if (ibv_get_async_event(ctx, &ev) != 0) {
			/* readable, then taken by nobody else: EAGAIN would be a bug */
			FAIL("ibv_get_async_event after async_fd polled readable");
		}
		int is_ours = ev.event_type == IBV_EVENT_CQ_ERR && ev.element.cq == cq;
		int is_other_cq = ev.event_type == IBV_EVENT_CQ_ERR && ev.element.cq != cq;
		struct ibv_cq *other = ev.element.cq;
		ibv_ack_async_event(&ev);
		CHECKF(!is_other_cq, "IBV_EVENT_CQ_ERR names CQ %p, expected %p", (void *)other,
		       (void *)cq);
		if (is_ours) {
			found++;
			if (stop_at_first)
				break;
		}
	}
	return found;
}

/* Waits for a completion event on a non-blocking channel and takes it. */
static void expect_event(struct ibv_comp_channel *ch, struct ibv_cq *cq, void *cq_context,
			 const char *what)
{
	CHECKF(fd_readable(ch->fd, WAIT_MS), "no completion event for %s within %d ms", what,
	       WAIT_MS);
	struct ibv_cq *ev_cq = NULL;
	void *ev_ctx = NULL;
	CHECKF(ibv_get_cq_event(ch, &ev_cq, &ev_ctx) == 0,
	       "ibv_get_cq_event after the channel fd polled readable (%s)", what);
	CHECKF(ev_cq == cq, "event for %s names CQ %p, expected %p", what, (void *)ev_cq,
	       (void *)cq);
	CHECKF(ev_ctx == cq_context, "event for %s carries cq_context %p, expected %p", what,
	       ev_ctx, cq_context);
}

/* No completion event may be (or become) pending on a non-blocking channel. */
static void expect_no_event(struct ibv_comp_channel *ch, const char *what)
{
	CHECKF(!fd_readable(ch->fd, QUIET_MS), "the channel fd became readable: an event for %s",
	       what);
	struct ibv_cq *ev_cq = NULL;
	void *ev_ctx = NULL;
	errno = 0;
	int rc = ibv_get_cq_event(ch, &ev_cq, &ev_ctx);
	CHECKF(rc == -1 && errno == EAGAIN,
	       "ibv_get_cq_event on an empty non-blocking channel returned %d (%s), expected -1/EAGAIN",
	       rc, what);
}

/* Polls n receive completions: successful, in order, wr_ids first..first+n-1. */
static void expect_recvs(struct ibv_cq *cq, int n, uint64_t first, uint32_t qp_num, uint32_t len)
{
	struct ibv_wc wc[64];
	CHECK(n <= 64);
	int got = poll_until(cq, n, wc, WAIT_MS);
	CHECKF(got == n, "expected %d receive completions, ibv_poll_cq gave %d", n, got);
	for (int i = 0; i < n; i++) {
		CHECKF(wc[i].status == IBV_WC_SUCCESS, "receive %d: status %s", i,
		       ibv_wc_status_str(wc[i].status));
		CHECKF(wc[i].opcode == IBV_WC_RECV, "receive %d: opcode %d", i, wc[i].opcode);
		CHECKF(wc[i].wr_id == first + (uint64_t)i,
		       "receive %d: wr_id %" PRIu64 ", expected %" PRIu64, i, wc[i].wr_id,
		       first + (uint64_t)i);
		CHECKF(wc[i].byte_len == len, "receive %d: byte_len %u, expected %u", i,
		       wc[i].byte_len, len);
		CHECKF(wc[i].qp_num == qp_num, "receive %d: qp_num %u, expected %u", i,
		       wc[i].qp_num, qp_num);
	}
	struct ibv_wc extra;
	CHECKF(ibv_poll_cq(cq, 1, &extra) == 0, "a completion beyond the %d expected", n);
}

/* ------------------------------------------------------------------ the rules */

/*
 * Rule 1. ibv_poll_cq(3), NOTES: "The user should consume work completions at a rate
 * that prevents CQ overrun from occurrence. In case of a CQ overrun, the async event
 * IBV_EVENT_CQ_ERR will be triggered, and the CQ cannot be used." RETURN VALUE: "On
 * failure, a negative value is returned." ibv_get_async_event(3): IBV_EVENT_CQ_ERR "CQ
 * is in error (CQ overrun)", element.cq "CQ that got the event", acknowledged with
 * ibv_ack_async_event().
 *
 * B's receive CQ holds cq->cqe entries; cq->cqe + 2 receives complete into it without
 * a poll.
 */
static void rule1_overrun(void)
{
	start_rule("1 (CQ overrun -> error, negative poll, IBV_EVENT_CQ_ERR)");
	struct ibv_cq *small = create_cq(2, NULL, NULL);
	int n = small->cqe + 2;
	struct ibv_cq *aux = create_cq(n + 8, NULL, NULL);
	struct pair p = make_pair(aux, aux, aux, small, (uint32_t)n);
	post_recvs(p.b, 1000, n);
	for (int i = 0; i < n; i++)
		post_send(p.a, (uint64_t)i, 64, 0);
	/* Not polled until the event says it overran, so nothing can drain it early. */
	CHECKF(cq_err_events(small, WAIT_MS, 1) == 1,
	       "no IBV_EVENT_CQ_ERR for CQ %p within %d ms after %d completions into a CQ of %d",
	       (void *)small, WAIT_MS, n, small->cqe);
	struct ibv_wc wc[8];
	int rc = ibv_poll_cq(small, 8, wc);
	CHECKF(rc < 0, "ibv_poll_cq on the overrun CQ returned %d, expected a negative value", rc);
	/* "the CQ cannot be used": it stays in error */
	rc = ibv_poll_cq(small, 1, wc);
	CHECKF(rc < 0, "second ibv_poll_cq on the overrun CQ returned %d", rc);
	destroy_pair(p);
	CHECK(ibv_destroy_cq(small) == 0);
	CHECK(ibv_destroy_cq(aux) == 0);
	rule_ok();
}

/*
 * Rule 2. ibv_create_cq_ex(3): IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN "This CQ will not pass
 * to error state if overrun, CQE always will be written to next entry. An application
 * must be designed to avoid ever overflowing the CQ, otherwise CQEs might be lost."
 * (flags, valid with comp_mask IBV_CQ_INIT_ATTR_MASK_FLAGS).
 */
static void rule2_ignore_overrun(void)
{
	start_rule("2 (IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN: no error, no CQ_ERR)");
	struct ibv_cq_init_attr_ex attr = {
		.cqe = 2,
		.comp_vector = 0,
		.wc_flags = IBV_WC_STANDARD_FLAGS,
		.comp_mask = IBV_CQ_INIT_ATTR_MASK_FLAGS,
		.flags = IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN,
	};
	struct ibv_cq_ex *cq_ex = ibv_create_cq_ex(ctx, &attr);
	CHECKF(cq_ex != NULL, "ibv_create_cq_ex(IGNORE_OVERRUN)");
	struct ibv_cq *cq = ibv_cq_ex_to_cq(cq_ex);
	int cap = cq->cqe;
	CHECK(cap >= 2);
	int n = cap + 3;
	struct ibv_cq *aux = create_cq(n + 8, NULL, NULL);
	struct pair p = make_pair(aux, aux, aux, cq, (uint32_t)n + 1);
	post_recvs(p.b, 2000, n + 1);
	send_and_wait(p, aux, 0, n, 0);
	/* n receive completions went into a CQ of cap entries, none polled */
	CHECKF(cq_err_events(cq, QUIET_MS, 0) == 0,
	       "IBV_EVENT_CQ_ERR for a CQ created with IGNORE_OVERRUN");
	struct ibv_wc wc[64];
	CHECK(n <= 64);
	int got = ibv_poll_cq(cq, 64, wc);
	CHECKF(got >= 0, "ibv_poll_cq on an overrun IGNORE_OVERRUN CQ returned %d", got);
	CHECKF(got >= 1 && got <= cap, "polled %d completions from a CQ of %d after an overrun",
	       got, cap);
	for (int i = 0; i < got; i++) {
		CHECKF(wc[i].status == IBV_WC_SUCCESS && wc[i].opcode == IBV_WC_RECV,
		       "completion %d: status %d opcode %d", i, wc[i].status, wc[i].opcode);
		CHECKF(wc[i].wr_id >= 2000 && wc[i].wr_id < 2000 + (uint64_t)n,
		       "completion %d: wr_id %" PRIu64 " is none of the receives", i, wc[i].wr_id);
		for (int j = 0; j < i; j++)
			CHECKF(wc[j].wr_id != wc[i].wr_id,
			       "completion wr_id %" PRIu64 " polled twice after an overrun",
			       wc[i].wr_id);
		CHECKF(wc[i].qp_num == p.b->qp_num, "completion %d: qp_num %u", i, wc[i].qp_num);
	}
	CHECKF(ibv_poll_cq(cq, 1, wc) == 0, "the CQ is not empty after polling it dry");
	/* polling keeps working: one more completion arrives and is polled */
	send_and_wait(p, aux, 100, 1, 0);
	expect_recvs(cq, 1, 2000 + (uint64_t)n, p.b->qp_num, 64);
	/* and the extended poll works on it too */
	struct ibv_poll_cq_attr pattr = { 0 };
	CHECK(ibv_start_poll(cq_ex, &pattr) == ENOENT);
	CHECKF(cq_err_events(cq, QUIET_MS, 0) == 0,
	       "IBV_EVENT_CQ_ERR for a CQ created with IGNORE_OVERRUN (after more polls)");
	destroy_pair(p);
	CHECK(ibv_destroy_cq(cq) == 0);
	CHECK(ibv_destroy_cq(aux) == 0);
	rule_ok();
}

/*
 * Rule 3. ibv_req_notify_cq(3): "If solicited_only is non-zero, an event is only
 * generated for a new CQE with that is considered "solicited." A CQE is solicited if it
 * is a receive completion for a message with the Solicited Event header bit set, or if
 * the status is not successful. All other successful receive completions, or any
 * successful send completion is unsolicited." The solicited bit is set by
 * IBV_SEND_SOLICITED (ibv_post_send(3)).
 */
static void rule3_solicited_only(void)
{
	start_rule("3 (solicited-only events)");
	int tag;
	struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
	CHECK(ch != NULL);
	set_nonblocking(ch->fd);
	struct ibv_cq *rcq = create_cq(16, &tag, ch);
	struct ibv_cq *aux = create_cq(16, NULL, NULL);
	struct pair p = make_pair(aux, aux, aux, rcq, 8);
	post_recvs(p.b, 3000, 3);
	CHECK(ibv_req_notify_cq(rcq, 1) == 0);

	/* an unsolicited receive: no event */
	send_and_wait(p, aux, 0, 1, 0);
	expect_no_event(ch, "an unsolicited receive under solicited-only arming");
	expect_recvs(rcq, 1, 3000, p.b->qp_num, 64);

	/* a solicited one: the event (still armed: nothing consumed the arm) */
	send_and_wait(p, aux, 1, 1, IBV_SEND_SOLICITED);
	expect_event(ch, rcq, &tag, "a receive of an IBV_SEND_SOLICITED send");
	ibv_ack_cq_events(rcq, 1);
	expect_recvs(rcq, 1, 3001, p.b->qp_num, 64);

	/* an unsuccessful completion is solicited too: a receive flushed by moving B to
	 * the error state */
	CHECK(ibv_req_notify_cq(rcq, 1) == 0);
	struct ibv_qp_attr err = { .qp_state = IBV_QPS_ERR };
	CHECK(ibv_modify_qp(p.b, &err, IBV_QP_STATE) == 0);
	expect_event(ch, rcq, &tag, "a flushed (unsuccessful) receive under solicited-only arming");
	ibv_ack_cq_events(rcq, 1);
	struct ibv_wc wc;
	CHECKF(poll_until(rcq, 1, &wc, WAIT_MS) == 1, "no flush completion for the posted receive");
	CHECKF(wc.status == IBV_WC_WR_FLUSH_ERR && wc.wr_id == 3002,
	       "flushed receive: status %s wr_id %" PRIu64, ibv_wc_status_str(wc.status), wc.wr_id);

	destroy_pair(p);
	CHECK(ibv_destroy_cq(rcq) == 0);
	CHECK(ibv_destroy_cq(aux) == 0);
	CHECK(ibv_destroy_comp_channel(ch) == 0);
	rule_ok();
}

/*
 * Rule 4. ibv_req_notify_cq(3), NOTES: "The request for notification is "one shot."
 * Only one completion event will be generated for each call to ibv_req_notify_cq()."
 */
static void rule4_one_shot(void)
{
	start_rule("4 (one-shot arming)");
	int tag;
	struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
	CHECK(ch != NULL);
	set_nonblocking(ch->fd);
	struct ibv_cq *rcq = create_cq(16, &tag, ch);
	struct ibv_cq *aux = create_cq(16, NULL, NULL);
	struct pair p = make_pair(aux, aux, aux, rcq, 8);
	post_recvs(p.b, 4000, 5);

	CHECK(ibv_req_notify_cq(rcq, 0) == 0);
	send_and_wait(p, aux, 0, 1, 0);
	expect_event(ch, rcq, &tag, "the first completion after arming");
	ibv_ack_cq_events(rcq, 1);
	/* not re-armed: two more completions (one of them solicited) raise nothing */
	send_and_wait(p, aux, 1, 1, 0);
	send_and_wait(p, aux, 2, 1, IBV_SEND_SOLICITED);
	expect_no_event(ch, "completions after the one-shot arm fired");
	expect_recvs(rcq, 3, 4000, p.b->qp_num, 64);
	/* re-armed: the next completion raises exactly one event again */
	CHECK(ibv_req_notify_cq(rcq, 0) == 0);
	send_and_wait(p, aux, 3, 2, 0);
	expect_event(ch, rcq, &tag, "the first completion after re-arming");
	ibv_ack_cq_events(rcq, 1);
	expect_no_event(ch, "the second completion after re-arming");
	expect_recvs(rcq, 2, 4003, p.b->qp_num, 64);

	destroy_pair(p);
	CHECK(ibv_destroy_cq(rcq) == 0);
	CHECK(ibv_destroy_cq(aux) == 0);
	CHECK(ibv_destroy_comp_channel(ch) == 0);
	rule_ok();
}

/*
 * Rule 5. ibv_get_cq_event(3), EXAMPLES, non-blocking mode: "Set the completion event
 * channel to be non-blocked" with fcntl(O_NONBLOCK), then poll(2) the channel's fd
 * until it has an event, then ibv_get_cq_event; with nothing pending the read fails
 * (-1, errno EAGAIN, as read(2) on a non-blocking fd). ibv_get_async_event(3) gives the
 * same example for ctx->async_fd.
 */
static void rule5_nonblocking_fds(void)
{
	start_rule("5 (non-blocking channel and async fds: poll()able, EAGAIN when empty)");
	int tag;
	struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
	CHECK(ch != NULL);
	set_nonblocking(ch->fd);
	struct pollfd pfd = { .fd = ch->fd, .events = POLLIN };
	CHECK(poll(&pfd, 1, 0) == 0);
	struct ibv_cq *ev_cq = NULL;
	void *ev_ctx = NULL;
	errno = 0;
	CHECKF(ibv_get_cq_event(ch, &ev_cq, &ev_ctx) == -1 && errno == EAGAIN,
	       "ibv_get_cq_event on a fresh non-blocking channel");

	struct ibv_cq *rcq = create_cq(16, &tag, ch);
	struct ibv_cq *aux = create_cq(16, NULL, NULL);
	struct pair p = make_pair(aux, aux, aux, rcq, 8);
	post_recvs(p.b, 5000, 1);
	CHECK(ibv_req_notify_cq(rcq, 0) == 0);
	send_and_wait(p, aux, 0, 1, 0);
	pfd.revents = 0;
	int rc = poll(&pfd, 1, WAIT_MS);
	CHECKF(rc == 1 && (pfd.revents & POLLIN), "poll() on the channel fd: %d, revents 0x%x", rc,
	       pfd.revents);
	CHECK(ibv_get_cq_event(ch, &ev_cq, &ev_ctx) == 0);
	CHECK(ev_cq == rcq && ev_ctx == &tag);
	ibv_ack_cq_events(rcq, 1);
	/* taken: empty again */
	pfd.revents = 0;
	CHECKF(poll(&pfd, 1, 0) == 0, "the channel fd is still readable after its one event was taken");
	errno = 0;
	CHECKF(ibv_get_cq_event(ch, &ev_cq, &ev_ctx) == -1 && errno == EAGAIN,
	       "ibv_get_cq_event on an emptied non-blocking channel");
	expect_recvs(rcq, 1, 5000, p.b->qp_num, 64);

	/* the async fd: drain what is queued (the port's PORT_ACTIVE, ...), then empty */
	for (int i = 0; i < 1000; i++) {
		struct ibv_async_event ev;
		if (ibv_get_async_event(ctx, &ev) != 0)
			break;
		ibv_ack_async_event(&ev);
	}
	struct pollfd afd = { .fd = ctx->async_fd, .events = POLLIN };
	CHECKF(poll(&afd, 1, 0) == 0, "async_fd readable with no async event queued");
	struct ibv_async_event ev;
	errno = 0;
	CHECKF(ibv_get_async_event(ctx, &ev) == -1 && errno == EAGAIN,
	       "ibv_get_async_event on an empty non-blocking async_fd");

	destroy_pair(p);
	CHECK(ibv_destroy_cq(rcq) == 0);
	CHECK(ibv_destroy_cq(aux) == 0);
	CHECK(ibv_destroy_comp_channel(ch) == 0);
	rule_ok();
}

/*
 * Rule 6. ibv_destroy_cq(3), NOTES: "ibv_destroy_cq() fails if any queue pair is still
 * associated with this CQ." RETURN VALUE: "the value of errno on failure" (EBUSY, as in
 * libibverbs). ibv_create_comp_channel(3): "ibv_destroy_comp_channel() fails if any CQs
 * are still associated with the completion event channel being destroyed."
 */
static void rule6_destroy_busy(void)
{
	start_rule("6 (ibv_destroy_cq: EBUSY while a QP uses the CQ)");
	struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
	CHECK(ch != NULL);
	struct ibv_cq *scq = create_cq(8, NULL, ch);
	struct ibv_cq *rcq = create_cq(8, NULL, NULL);
	struct ibv_qp *qp = create_rc(scq, rcq, 4);
	int rc = ibv_destroy_cq(scq);
	CHECKF(rc == EBUSY, "ibv_destroy_cq of a QP's send CQ returned %d, expected EBUSY", rc);
	rc = ibv_destroy_cq(rcq);
	CHECKF(rc == EBUSY, "ibv_destroy_cq of a QP's receive CQ returned %d, expected EBUSY", rc);
	rc = ibv_destroy_comp_channel(ch);
	CHECKF(rc == EBUSY, "ibv_destroy_comp_channel with a CQ attached returned %d, expected EBUSY",
	       rc);
	/* refused, not half-destroyed: the CQs still work */
	struct ibv_wc wc;
	CHECK(ibv_poll_cq(scq, 1, &wc) == 0);
	CHECK(ibv_poll_cq(rcq, 1, &wc) == 0);
	CHECK(ibv_req_notify_cq(scq, 0) == 0);
	/* a connected, used QP counts too */
	struct ibv_cq *aux = create_cq(8, NULL, NULL);
	struct pair p = make_pair(aux, aux, aux, rcq, 4);
	post_recvs(p.b, 6000, 1);
	send_and_wait(p, aux, 0, 1, 0);
	expect_recvs(rcq, 1, 6000, p.b->qp_num, 64);
	rc = ibv_destroy_cq(rcq);
	CHECKF(rc == EBUSY, "ibv_destroy_cq of a CQ used by two QPs returned %d", rc);
	CHECK(ibv_destroy_qp(qp) == 0);
	rc = ibv_destroy_cq(rcq);
	CHECKF(rc == EBUSY, "ibv_destroy_cq of a CQ still used by one QP returned %d", rc);
	destroy_pair(p);
	CHECK(ibv_destroy_cq(scq) == 0);
	CHECK(ibv_destroy_cq(rcq) == 0);
	CHECK(ibv_destroy_cq(aux) == 0);
	CHECK(ibv_destroy_comp_channel(ch) == 0);
	rule_ok();
}

/*
 * Rule 7. ibv_resize_cq(3): "resizes the completion queue (CQ) cq to have at least cqe
 * entries. cqe must be at least the number of unpolled entries in the CQ cq." NOTES:
 * "The cqe member of cq will be updated to the actual size." Resizing keeps the CQ's
 * contents: every completion is polled afterwards, in order.
 */
static void rule7_resize(void)
{
	start_rule("7 (ibv_resize_cq keeps outstanding completions in order)");
	struct ibv_cq *rcq = create_cq(4, NULL, NULL);
	int cap = rcq->cqe;
	int total = 2 * cap + 3;
	CHECK(total <= 64);
	struct ibv_cq *aux = create_cq(64, NULL, NULL);
	struct pair p = make_pair(aux, aux, aux, rcq, (uint32_t)total);
	post_recvs(p.b, 7000, total);

	/* fill the CQ to its size, unpolled */
	send_and_wait(p, aux, 0, cap, 0);
	/* below the number of unpolled entries: refused, nothing lost */
	int rc = ibv_resize_cq(rcq, 1);
	CHECKF(rc != 0, "ibv_resize_cq to 1 entry with %d unpolled succeeded", cap);
	CHECKF(rcq->cqe >= cap, "a refused resize changed cq->cqe to %d", rcq->cqe);
	/* grow with the CQ full */
	rc = ibv_resize_cq(rcq, 4 * cap);
	CHECKF(rc == 0, "ibv_resize_cq(%d) with %d unpolled returned %d", 4 * cap, cap, rc);
	CHECKF(rcq->cqe >= 4 * cap, "cq->cqe %d after resizing to %d", rcq->cqe, 4 * cap);
	/* more than the old size fits now: without the resize these would overrun */
	send_and_wait(p, aux, (uint64_t)cap, cap + 1, 0);
	/* shrink to exactly the unpolled count (2 * cap + 1) */
	rc = ibv_resize_cq(rcq, 2 * cap + 1);
	CHECKF(rc == 0, "ibv_resize_cq(%d) with %d unpolled returned %d", 2 * cap + 1, 2 * cap + 1,
	       rc);
	CHECKF(rcq->cqe >= 2 * cap + 1, "cq->cqe %d after resizing to %d", rcq->cqe, 2 * cap + 1);
	/* take a few, resize again with the rest outstanding, add two, take all */
	struct ibv_wc wc[64];
	int got = poll_until(rcq, 2, wc, WAIT_MS);
	CHECKF(got == 2, "polled %d of the first 2 completions after resizing", got);
	CHECK(wc[0].wr_id == 7000 && wc[1].wr_id == 7001);
	rc = ibv_resize_cq(rcq, 64);
	CHECKF(rc == 0, "ibv_resize_cq(64) with %d unpolled returned %d", 2 * cap - 1, rc);
	send_and_wait(p, aux, (uint64_t)(2 * cap + 1), 2, 0);
	got = poll_until(rcq, total - 2, wc, WAIT_MS);
	CHECKF(got == total - 2, "polled %d of %d completions after the resizes", got, total - 2);
	for (int i = 0; i < got; i++) {
		CHECKF(wc[i].status == IBV_WC_SUCCESS && wc[i].opcode == IBV_WC_RECV,
		       "completion %d after resize: status %d opcode %d", i, wc[i].status,
		       wc[i].opcode);
		CHECKF(wc[i].wr_id == 7002 + (uint64_t)i,
		       "completion %d after resize: wr_id %" PRIu64 ", expected %" PRIu64, i,
		       wc[i].wr_id, 7002 + (uint64_t)i);
		CHECKF(wc[i].qp_num == p.b->qp_num && wc[i].byte_len == 64,
		       "completion %d after resize: qp_num %u byte_len %u", i, wc[i].qp_num,
		       wc[i].byte_len);
	}
	CHECKF(ibv_poll_cq(rcq, 1, wc) == 0, "a completion beyond the %d produced", total);
	destroy_pair(p);
	CHECK(ibv_destroy_cq(rcq) == 0);
	CHECK(ibv_destroy_cq(aux) == 0);
	rule_ok();
}

/*
 * Rule 8. ibv_create_cq_ex(3), "Polling an extended CQ": ibv_start_poll "When no
 * completions are available on the CQ, ENOENT is returned ... If an error code is
 * given, end_poll shouldn't be called"; ibv_next_poll "When no completions are available
 * on the CQ, ENOENT is returned ... If an error code is given, end_poll should still be
 * called"; wr_id and status "Can be accessed directly from struct ibv_cq_ex";
 * ibv_wc_read_opcode / _byte_len / _qp_num, and ibv_wc_read_completion_ts "Get the
 * completion timestamp from the current completion in HCA clock units" (requested with
 * IBV_WC_EX_WITH_COMPLETION_TIMESTAMP). ibv_query_rt_values_ex(3): raw_clock is the
 * "HW raw clock", the same clock.
 */
struct polled {
	uint64_t wr_id;
	enum ibv_wc_status status;
	enum ibv_wc_opcode opcode;
	uint32_t byte_len, qp_num;
	uint64_t ts;
};

static void read_current(struct ibv_cq_ex *cq, struct polled *out)
{
	out->wr_id = cq->wr_id;
	out->status = cq->status;
	out->opcode = ibv_wc_read_opcode(cq);
	out->byte_len = ibv_wc_read_byte_len(cq);
	out->qp_num = ibv_wc_read_qp_num(cq);
	out->ts = ibv_wc_read_completion_ts(cq);
}

static uint64_t raw_clock(void)
{
	struct ibv_values_ex v = { .comp_mask = IBV_VALUES_MASK_RAW_CLOCK };
	CHECKF(ibv_query_rt_values_ex(ctx, &v) == 0 && (v.comp_mask & IBV_VALUES_MASK_RAW_CLOCK),
	       "ibv_query_rt_values_ex(RAW_CLOCK)");
	return (uint64_t)v.raw_clock.tv_sec * 1000000000u + (uint64_t)v.raw_clock.tv_nsec;
}

static void rule8_cq_ex_timestamps(void)
{
	start_rule("8 (ibv_create_cq_ex + COMPLETION_TIMESTAMP, start/next/end_poll, readers)");
	struct ibv_device_attr_ex ax;
	memset(&ax, 0, sizeof(ax));
	CHECK(ibv_query_device_ex(ctx, NULL, &ax) == 0);
	CHECKF(ax.completion_timestamp_mask != 0, "completion_timestamp_mask is 0");
	struct ibv_cq_init_attr_ex attr = {
		.cqe = 16,
		.wc_flags = IBV_WC_EX_WITH_COMPLETION_TIMESTAMP | IBV_WC_EX_WITH_BYTE_LEN |
			    IBV_WC_EX_WITH_QP_NUM,
	};
	struct ibv_cq_ex *cq = ibv_create_cq_ex(ctx, &attr);
	CHECKF(cq != NULL, "ibv_create_cq_ex(COMPLETION_TIMESTAMP | BYTE_LEN | QP_NUM)");
	struct ibv_cq *base = ibv_cq_ex_to_cq(cq);
	CHECK(base->cqe >= 16);
	struct ibv_poll_cq_attr pattr = { .comp_mask = 0 };
	/* empty: ENOENT, and no end_poll */
	CHECK(ibv_start_poll(cq, &pattr) == ENOENT);
	CHECK(ibv_start_poll(cq, &pattr) == ENOENT);

	/* A sends and B receives into this one CQ: 2 sends + 2 receives */
	struct pair p = make_pair(base, base, base, base, 8);
	post_recvs(p.b, 8000, 2);
	uint64_t before = raw_clock();
	post_send(p.a, 1, 100, 0);
	post_send(p.a, 2, 200, 0);
	struct polled got[8];
	int n = 0;
	int64_t deadline = now_ms() + WAIT_MS;
	for (int iter = 0; iter < MAX_ITERS && n < 4 && now_ms() < deadline; iter++) {
		int rc = ibv_start_poll(cq, &pattr);
		if (rc == ENOENT) {
			usleep(50);
			continue;
		}
		CHECKF(rc == 0, "ibv_start_poll returned %d", rc);
		read_current(cq, &got[n++]);
		for (;;) {
			rc = ibv_next_poll(cq);
			if (rc == ENOENT)
				break;
			CHECKF(rc == 0, "ibv_next_poll returned %d", rc);
			CHECKF(n < 8, "more than 4 completions");
			read_current(cq, &got[n++]);
		}
		ibv_end_poll(cq); /* also after next_poll's ENOENT */
	}
	uint64_t after = raw_clock();
	CHECKF(n == 4, "polled %d of 4 completions with start/next/end_poll", n);
	CHECK(ibv_start_poll(cq, &pattr) == ENOENT); /* end_poll consumed the batch */

	int sends = 0, recvs = 0;
	uint64_t mask = ax.completion_timestamp_mask;
	for (int i = 0; i < n; i++) {
		struct polled *c = &got[i];
		CHECKF(c->status == IBV_WC_SUCCESS, "completion %d: status %s", i,
		       ibv_wc_status_str(c->status));
		if (c->wr_id == 1 || c->wr_id == 2) {
			CHECKF(c->opcode == IBV_WC_SEND, "send %" PRIu64 ": opcode %d", c->wr_id,
			       c->opcode);
			CHECKF(c->qp_num == p.a->qp_num, "send %" PRIu64 ": qp_num %u, expected %u",
			       c->wr_id, c->qp_num, p.a->qp_num);
			CHECKF((uint64_t)(sends + 1) == c->wr_id, "sends out of order");
			sends++;
		} else {
			CHECKF(c->wr_id == 8000 + (uint64_t)recvs, "receive wr_id %" PRIu64 ", expected %d",
			       c->wr_id, 8000 + recvs);
			CHECKF(c->opcode == IBV_WC_RECV, "receive %" PRIu64 ": opcode %d", c->wr_id,
			       c->opcode);
			CHECKF(c->qp_num == p.b->qp_num, "receive %" PRIu64 ": qp_num %u, expected %u",
			       c->wr_id, c->qp_num, p.b->qp_num);
			uint32_t want = recvs == 0 ? 100 : 200;
			CHECKF(c->byte_len == want, "receive %" PRIu64 ": byte_len %u, expected %u",
			       c->wr_id, c->byte_len, want);
			recvs++;
		}
		CHECKF(c->ts != 0, "completion %d: completion_ts is 0", i);
		CHECKF((c->ts & ~mask) == 0, "completion_ts 0x%" PRIx64 " outside the mask 0x%" PRIx64,
		       c->ts, mask);
		if ((after & mask) >= (before & mask)) { /* the clock did not wrap meanwhile */
			CHECKF(c->ts >= (before & mask) && c->ts <= (after & mask),
			       "completion %d: completion_ts %" PRIu64 " outside the raw clock's "
			       "[%" PRIu64 ", %" PRIu64 "] around the operation",
			       i, c->ts, before & mask, after & mask);
		}
		CHECKF(i == 0 || c->ts >= got[i - 1].ts,
		       "completion_ts goes backwards in CQ order: %" PRIu64 " then %" PRIu64,
		       got[i - 1].ts, c->ts);
	}
	CHECK(sends == 2 && recvs == 2);
	/* the plain poll on the same extended CQ: empty */
	struct ibv_wc wc;
	CHECK(ibv_poll_cq(base, 1, &wc) == 0);

	destroy_pair(p);
	CHECK(ibv_destroy_cq(base) == 0);
	rule_ok();
}

/*
 * Rule 9. ibv_get_cq_event(3), NOTES: "All completion events that ibv_get_cq_event()
 * returns must be acknowledged using ibv_ack_cq_events(). To avoid races, destroying a
 * CQ will wait for all completion events to be acknowledged; this guarantees a
 * one-to-one correspondence between acks and successful gets." and "it may be better to
 * amortize this cost ... acking several completion events in one call".
 *   9a: events acknowledged in one call, then ibv_destroy_cq returns (no hang).
 *   9b: ibv_destroy_cq on a CQ with unacknowledged events waits, and an
 *       ibv_ack_cq_events from another thread lets it return.
 */
struct destroyer {
	struct ibv_cq *cq;
	atomic_int done;
	int rc;
};

static void *destroy_thread(void *arg)
{
	struct destroyer *d = arg;
	d->rc = ibv_destroy_cq(d->cq);
	atomic_store(&d->done, 1);
	return NULL;
}

/* Takes `events` completion events of rcq (re-arming after each), none acknowledged. */
static void take_events(struct pair p, struct ibv_cq *aux, struct ibv_comp_channel *ch,
			struct ibv_cq *rcq, void *tag, uint64_t first, int events)
{
	CHECK(ibv_req_notify_cq(rcq, 0) == 0);
	for (int i = 0; i < events; i++) {
		send_and_wait(p, aux, first + (uint64_t)i, 1, 0);
		expect_event(ch, rcq, tag, "a completion while armed");
		CHECK(ibv_req_notify_cq(rcq, 0) == 0);
	}
}

static void rule9_ack_before_destroy(void)
{
	start_rule("9a (events acked in one call, then ibv_destroy_cq returns)");
	int tag;
	struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
	CHECK(ch != NULL);
	set_nonblocking(ch->fd);
	struct ibv_cq *rcq = create_cq(16, &tag, ch);
	struct ibv_cq *aux = create_cq(16, NULL, NULL);
	struct pair p = make_pair(aux, aux, aux, rcq, 8);
	post_recvs(p.b, 9000, 3);
	take_events(p, aux, ch, rcq, &tag, 0, 3);
	expect_recvs(rcq, 3, 9000, p.b->qp_num, 64);
	/* libibverbs counts acknowledgements in cq->comp_events_completed (the field
	 * ibv_destroy_cq compares with the events delivered, in verbs.h) */
	CHECK(rcq->comp_events_completed == 0);
	ibv_ack_cq_events(rcq, 3); /* all three in one call, as ibv_rc_pingpong -e does */
	CHECK(rcq->comp_events_completed == 3);
	destroy_pair(p);
	CHECK(ibv_destroy_cq(rcq) == 0); /* the watchdog names this rule if it hangs */
	CHECK(ibv_destroy_cq(aux) == 0);
	rule_ok();

	start_rule("9b (ibv_destroy_cq waits for the acks; an ack from another thread releases it)");
	rcq = create_cq(16, &tag, ch);
	aux = create_cq(16, NULL, NULL);
	p = make_pair(aux, aux, aux, rcq, 8);
	post_recvs(p.b, 9100, 2);
	take_events(p, aux, ch, rcq, &tag, 10, 2);
	expect_recvs(rcq, 2, 9100, p.b->qp_num, 64);
	destroy_pair(p);
	struct destroyer d = { .cq = rcq, .rc = -1 };
	atomic_init(&d.done, 0);
	pthread_t thread;
	CHECK(pthread_create(&thread, NULL, destroy_thread, &d) == 0);
	usleep(300 * 1000);
	if (atomic_load(&d.done)) {
		/* the CQ is gone: acking it now would touch freed memory */
		CHECK(pthread_join(thread, NULL) == 0);
		FAIL("ibv_destroy_cq returned %d without waiting for 2 unacknowledged events", d.rc);
	}
	ibv_ack_cq_events(rcq, 2);
	int64_t deadline = now_ms() + WAIT_MS;
	for (int iter = 0; iter < MAX_ITERS && !atomic_load(&d.done) && now_ms() < deadline; iter++)
		usleep(1000);
	/* still blocked: exit without joining (the watchdog would otherwise fire) */
	CHECKF(atomic_load(&d.done),
	       "ibv_destroy_cq still blocked %d ms after every event was acknowledged", WAIT_MS);
	CHECK(pthread_join(thread, NULL) == 0);
	CHECKF(d.rc == 0, "ibv_destroy_cq returned %d after the acks", d.rc);
	CHECK(ibv_destroy_cq(aux) == 0);
	CHECK(ibv_destroy_comp_channel(ch) == 0);
	rule_ok();
}

int main(void)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	signal(SIGALRM, watchdog);
	start_rule("setup");
	open_device();
	rule_ok();
	rule1_overrun();
	rule2_ignore_overrun();
	rule3_solicited_only();
	rule4_one_shot();
	rule5_nonblocking_fds();
	rule6_destroy_busy();
	rule7_resize();
	rule8_cq_ex_timestamps();
	rule9_ack_before_destroy();
	start_rule("teardown");
	close_device();
	rule_ok();
	printf("ok %d checks\n", checks);
	return 0;
}
