/*
 * Protection domains on the drop-in, through the real inline verbs functions
 * (ibv_post_send, ibv_post_recv, ibv_poll_cq, ibv_create_qp_ex, ibv_wr_*): a QP reaches only
 * memory regions of its own PD (IBTA vol. 1 ch. 10, protection domains: a QP may access a
 * memory region only if the PD assigned to the QP matches the region's; the kernel's rxe
 * refuses such a key in its MR lookup). An R_Key or L_Key of a region in another PD is
 * refused like an invalid key, with the statuses of ibv_poll_cq(3), and nothing is touched.
 *
 * One process, one device (softverbs0), two PDs: pd_a holds every QP and region A,
 * pd_b holds region B. RC QP pairs are connected to each other through the device
 * (RoCEv2 address = GID index 0). One of each pair is made by ibv_create_qp, the other by
 * ibv_create_qp_ex, so both creation paths must give the QP its PD for the same-PD
 * checks to pass.
 *
 *   1 RDMA WRITE to region A (same PD) lands
 *   2 RDMA WRITE naming region B's rkey: IBV_WC_REM_ACCESS_ERR, region B unchanged,
 *     the responder QP in ERR (ibv_query_qp)
 *   3 SEND gathering from region A (same PD) is received
 *   4 SEND whose lkey is region B's: IBV_WC_LOC_PROT_ERR, nothing received
 *   5 ibv_wr_rdma_write (extended post) naming region B's rkey: IBV_WC_REM_ACCESS_ERR
 *   6 a UD send whose address handle is of pd_b: ibv_post_send returns EINVAL with *bad_wr
 *     naming it and nothing is sent (IBTA 10.2.3: a QP uses only address handles of its
 *     own PD; rdmavt refuses it the same way); with an address handle of pd_a it is
 *     received
 *
 * Prints one "rule N ... ok" line per rule and "ok <checks> checks" at the end; exits 1
 * with "FAIL rule N (...)" on stderr at the first failed check. Every wait is bounded (a
 * deadline and an iteration count), and a watchdog alarm ends the program naming the rule
 * if a call blocks. Everything is freed, so leak checkers have nothing to report.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
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

/* Exactly one completion on cq: its status, wr_id and QP must be the ones given. */
static void expect_one(struct ibv_cq *cq, enum ibv_wc_status status, uint64_t wr_id,
		       uint32_t qp_num)
{
	struct ibv_wc wc;
	int got = poll_until(cq, 1, &wc, WAIT_MS);
	CHECKF(got == 1, "expected a completion (status %s), ibv_poll_cq gave %d",
	       ibv_wc_status_str(status), got);
	CHECKF(wc.status == status, "wr_id %" PRIu64 ": status %s, expected %s", wc.wr_id,
	       ibv_wc_status_str(wc.status), ibv_wc_status_str(status));
	CHECKF(wc.wr_id == wr_id, "wr_id %" PRIu64 ", expected %" PRIu64, wc.wr_id, wr_id);
	CHECKF(wc.qp_num == qp_num, "qp_num %u, expected %u", wc.qp_num, qp_num);
}

/* Nothing arrives on cq for QUIET_MS. */
static void expect_none(struct ibv_cq *cq)
{
	struct ibv_wc wc;
	int got = poll_until(cq, 1, &wc, QUIET_MS);
	CHECKF(got == 0, "expected no completion, got %d (status %s, wr_id %" PRIu64 ")", got,
	       got > 0 ? ibv_wc_status_str(wc.status) : "-", got > 0 ? wc.wr_id : 0);
}

/* ------------------------------------------------------------------ the device */

#define REGION 8192
/* Offsets in a region: where sends read from, where writes and receives land. */
#define SRC 0
#define DST 4096
#define LEN 64
#define MARK_A 0x11
#define MARK_B 0x5a

static struct ibv_context *ctx;
static struct ibv_pd *pd_a, *pd_b;
static struct ibv_mr *mr_a, *mr_b;
static char *buf_a, *buf_b;
static union ibv_gid gid;

static struct ibv_mr *region(struct ibv_pd *pd, char **buf, int fill)
{
	*buf = aligned_alloc(4096, REGION);
	CHECK(*buf != NULL);
	memset(*buf, fill, REGION);
	struct ibv_mr *mr = ibv_reg_mr(pd, *buf, REGION,
				       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
					       IBV_ACCESS_REMOTE_READ);
	CHECKF(mr != NULL, "ibv_reg_mr");
	CHECK(mr->pd == pd);
	return mr;
}

static void open_device(void)
{
	ctx = open_softverbs0();
	CHECK(ibv_query_gid(ctx, 1, 0, &gid) == 0);
	pd_a = ibv_alloc_pd(ctx);
	pd_b = ibv_alloc_pd(ctx);
	CHECK(pd_a != NULL && pd_b != NULL && pd_a != pd_b);
	mr_a = region(pd_a, &buf_a, MARK_A);
	mr_b = region(pd_b, &buf_b, MARK_B);
}

static void close_device(void)
{
	CHECK(ibv_dereg_mr(mr_a) == 0);
	CHECK(ibv_dereg_mr(mr_b) == 0);
	free(buf_a);
	free(buf_b);
	CHECK(ibv_dealloc_pd(pd_a) == 0);
	CHECK(ibv_dealloc_pd(pd_b) == 0);
	CHECK(ibv_close_device(ctx) == 0);
}

/* An RC QP in pd_a completing into cq, by ibv_create_qp or (extended) ibv_create_qp_ex. */
static struct ibv_qp *create_rc(struct ibv_cq *cq, int extended)
{
	struct ibv_qp_cap cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1,
				  .max_recv_sge = 1 };
	struct ibv_qp *qp;
	if (extended) {
		/* More than IBV_QP_INIT_ATTR_PD, so the inline goes to the library's
		 * create_qp_ex instead of falling back to ibv_create_qp. */
		struct ibv_qp_init_attr_ex attr = {
			.send_cq = cq,
			.recv_cq = cq,
			.cap = cap,
			.qp_type = IBV_QPT_RC,
			.sq_sig_all = 1,
			.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
			.pd = pd_a,
			.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE,
		};
		qp = ibv_create_qp_ex(ctx, &attr);
		CHECKF(qp != NULL, "ibv_create_qp_ex(RC)");
		CHECK(ibv_qp_to_qp_ex(qp) != NULL);
	} else {
		struct ibv_qp_init_attr attr = {
			.send_cq = cq,
			.recv_cq = cq,
			.cap = cap,
			.qp_type = IBV_QPT_RC,
			.sq_sig_all = 1,
		};
		qp = ibv_create_qp(pd_a, &attr);
		CHECKF(qp != NULL, "ibv_create_qp(RC)");
	}
	CHECK(qp->pd == pd_a);
	return qp;
}

/* RESET -> INIT -> RTR -> RTS towards `remote` (a QP of the same device), which may write
 * and read this QP's regions. */
static void connect_qp(struct ibv_qp *qp, uint32_t remote)
{
	connect_rc(qp, remote, &gid, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
}

/* Two connected RC QPs in pd_a, each with its own CQ: `req` sends, `resp` responds. */
struct pair {
	struct ibv_qp *req, *resp;
	struct ibv_cq *req_cq, *resp_cq;
};

static struct pair make_pair(int req_extended)
{
	struct pair p;
	p.req_cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	p.resp_cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	CHECK(p.req_cq != NULL && p.resp_cq != NULL);
	p.req = create_rc(p.req_cq, req_extended);
	p.resp = create_rc(p.resp_cq, !req_extended);
	connect_qp(p.req, p.resp->qp_num);
	connect_qp(p.resp, p.req->qp_num);
	return p;
}

static void destroy_pair(struct pair p)
{
	CHECK(ibv_destroy_qp(p.req) == 0);
	CHECK(ibv_destroy_qp(p.resp) == 0);
	CHECK(ibv_destroy_cq(p.req_cq) == 0);
	CHECK(ibv_destroy_cq(p.resp_cq) == 0);
}

/* The QP's state, by ibv_query_qp (which must keep working on every QP). */
static enum ibv_qp_state qp_state(struct ibv_qp *qp)
{
	struct ibv_qp_attr attr;
	struct ibv_qp_init_attr init;
	memset(&attr, 0, sizeof(attr));
	memset(&init, 0, sizeof(init));
	CHECKF(ibv_query_qp(qp, &attr, IBV_QP_STATE, &init) == 0, "ibv_query_qp(%u)", qp->qp_num);
	CHECK(init.qp_type == IBV_QPT_RC);
	return attr.qp_state;
}

static int all_bytes(const char *p, int byte, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (p[i] != (char)byte)
			return 0;
	return 1;
}

static void post_rdma_write(struct ibv_qp *qp, uint64_t wr_id, struct ibv_mr *target)
{
	struct ibv_sge sge = { .addr = (uintptr_t)(buf_a + SRC), .length = LEN,
			       .lkey = mr_a->lkey };
	struct ibv_send_wr wr = {
		.wr_id = wr_id,
		.sg_list = &sge,
		.num_sge = 1,
		.opcode = IBV_WR_RDMA_WRITE,
		.send_flags = IBV_SEND_SIGNALED,
	};
	wr.wr.rdma.remote_addr = (uintptr_t)target->addr + DST;
	wr.wr.rdma.rkey = target->rkey;
	struct ibv_send_wr *bad = NULL;
	CHECKF(ibv_post_send(qp, &wr, &bad) == 0, "ibv_post_send(RDMA WRITE)");
}

static void post_send(struct ibv_qp *qp, uint64_t wr_id, struct ibv_mr *source, char *buf)
{
	struct ibv_sge sge = { .addr = (uintptr_t)(buf + SRC), .length = LEN,
			       .lkey = source->lkey };
	struct ibv_send_wr wr = {
		.wr_id = wr_id,
		.sg_list = &sge,
		.num_sge = 1,
		.opcode = IBV_WR_SEND,
		.send_flags = IBV_SEND_SIGNALED,
	};
	struct ibv_send_wr *bad = NULL;
	CHECKF(ibv_post_send(qp, &wr, &bad) == 0, "ibv_post_send(SEND)");
}

static void post_recv(struct ibv_qp *qp, uint64_t wr_id)
{
	struct ibv_sge sge = { .addr = (uintptr_t)(buf_a + DST), .length = LEN,
			       .lkey = mr_a->lkey };
	struct ibv_recv_wr wr = { .wr_id = wr_id, .sg_list = &sge, .num_sge = 1 };
	struct ibv_recv_wr *bad = NULL;
	CHECKF(ibv_post_recv(qp, &wr, &bad) == 0, "ibv_post_recv");
}

/* ------------------------------------------------------------------ the rules */

/* 1, 2: the requester made by ibv_create_qp, the responder by ibv_create_qp_ex. */
static void rules_rdma_write(void)
{
	struct pair p = make_pair(0);

	start_rule("1");
	memset(buf_a + DST, 0, LEN);
	post_rdma_write(p.req, 1, mr_a);
	expect_one(p.req_cq, IBV_WC_SUCCESS, 1, p.req->qp_num);
	CHECKF(all_bytes(buf_a + DST, MARK_A, LEN), "the write to region A did not land");
	rule_ok("RDMA WRITE to a region of the QP's PD lands");

	start_rule("2");
	post_rdma_write(p.req, 2, mr_b);
	expect_one(p.req_cq, IBV_WC_REM_ACCESS_ERR, 2, p.req->qp_num);
	CHECKF(all_bytes(buf_b, MARK_B, REGION), "region B (another PD) was written");
	CHECKF(qp_state(p.resp) == IBV_QPS_ERR, "responder QP %u not in ERR", p.resp->qp_num);
	CHECKF(qp_state(p.req) == IBV_QPS_ERR, "requester QP %u not in ERR", p.req->qp_num);
	expect_none(p.resp_cq);
	rule_ok("RDMA WRITE naming an rkey of another PD: IBV_WC_REM_ACCESS_ERR, "
		"region unchanged");

	destroy_pair(p);
}

/* 3, 4: the requester made by ibv_create_qp_ex, the responder by ibv_create_qp. */
static void rules_send(void)
{
	struct pair p = make_pair(1);

	start_rule("3");
	memset(buf_a + DST, 0, LEN);
	post_recv(p.resp, 30);
	post_send(p.req, 3, mr_a, buf_a);
	expect_one(p.req_cq, IBV_WC_SUCCESS, 3, p.req->qp_num);
	expect_one(p.resp_cq, IBV_WC_SUCCESS, 30, p.resp->qp_num);
	CHECKF(all_bytes(buf_a + DST, MARK_A, LEN), "the SEND was not received");
	rule_ok("SEND from a region of the QP's PD is received");

	start_rule("4");
	memset(buf_a + DST, 0, LEN);
	post_recv(p.resp, 40);
	post_send(p.req, 4, mr_b, buf_b);
	expect_one(p.req_cq, IBV_WC_LOC_PROT_ERR, 4, p.req->qp_num);
	expect_none(p.resp_cq);
	CHECKF(all_bytes(buf_a + DST, 0, LEN), "a SEND with a foreign lkey delivered bytes");
	CHECKF(qp_state(p.req) == IBV_QPS_ERR, "requester QP %u not in ERR", p.req->qp_num);
	CHECKF(qp_state(p.resp) == IBV_QPS_RTS, "responder QP %u left RTS", p.resp->qp_num);
	rule_ok("SEND with an lkey of another PD: IBV_WC_LOC_PROT_ERR, nothing sent");

	destroy_pair(p);
}

/* 5: the extended post (ibv_wr_*) of a QP made by ibv_create_qp_ex. */
static void rule_wr_rdma_write(void)
{
	struct pair p = make_pair(1);

	start_rule("5");
	struct ibv_qp_ex *qpx = ibv_qp_to_qp_ex(p.req);
	CHECK(qpx != NULL);
	ibv_wr_start(qpx);
	qpx->wr_id = 5;
	qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_write(qpx, mr_b->rkey, (uintptr_t)mr_b->addr + DST);
	ibv_wr_set_sge(qpx, mr_a->lkey, (uintptr_t)(buf_a + SRC), LEN);
	CHECKF(ibv_wr_complete(qpx) == 0, "ibv_wr_complete");
	expect_one(p.req_cq, IBV_WC_REM_ACCESS_ERR, 5, p.req->qp_num);
	CHECKF(all_bytes(buf_b, MARK_B, REGION), "region B (another PD) was written");
	rule_ok("ibv_wr_rdma_write naming an rkey of another PD: IBV_WC_REM_ACCESS_ERR");

	destroy_pair(p);
}

/* A UD QP in pd_a, in RTS, with Q_Key UD_QKEY, completing into cq. */
#define UD_QKEY 0x11110000u
static struct ibv_qp *create_ud(struct ibv_cq *cq)
{
	struct ibv_qp_init_attr init = {
		.send_cq = cq,
		.recv_cq = cq,
		.cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1,
			 .max_recv_sge = 1 },
		.qp_type = IBV_QPT_UD,
		.sq_sig_all = 1,
	};
	struct ibv_qp *qp = ibv_create_qp(pd_a, &init);
	CHECKF(qp != NULL, "ibv_create_qp(UD)");
	struct ibv_qp_attr attr = { .qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1,
				    .qkey = UD_QKEY };
	CHECK(ibv_modify_qp(qp, &attr,
			    IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY) == 0);
	attr.qp_state = IBV_QPS_RTR;
	CHECK(ibv_modify_qp(qp, &attr, IBV_QP_STATE) == 0);
	attr.qp_state = IBV_QPS_RTS;
	attr.sq_psn = 0;
	CHECK(ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_SQ_PSN) == 0);
	return qp;
}

/* An address handle in `pd` for this device's own GID. */
static struct ibv_ah *own_ah(struct ibv_pd *pd)
{
	struct ibv_ah_attr attr = { .is_global = 1, .port_num = 1 };
	attr.grh.dgid = gid;
	attr.grh.hop_limit = 64;
	struct ibv_ah *ah = ibv_create_ah(pd, &attr);
	CHECKF(ah != NULL, "ibv_create_ah");
	CHECK(ah->pd == pd);
	return ah;
}

/* 6: UD sends name their destination by an address handle, which belongs to a PD. */
static void rule_ud_address_handle(void)
{
	struct ibv_cq *scq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	struct ibv_cq *rcq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	CHECK(scq != NULL && rcq != NULL);
	struct ibv_qp *sender = create_ud(scq);
	struct ibv_qp *receiver = create_ud(rcq);
	struct ibv_ah *foreign = own_ah(pd_b), *own = own_ah(pd_a);

	start_rule("6");
	memset(buf_a + DST, 0, 40 + LEN);
	struct ibv_sge rsge = { .addr = (uintptr_t)(buf_a + DST), .length = 40 + LEN,
				.lkey = mr_a->lkey };
	struct ibv_recv_wr rwr = { .wr_id = 60, .sg_list = &rsge, .num_sge = 1 };
	struct ibv_recv_wr *rbad = NULL;
	CHECK(ibv_post_recv(receiver, &rwr, &rbad) == 0);
	struct ibv_sge sge = { .addr = (uintptr_t)(buf_a + SRC), .length = LEN,
			       .lkey = mr_a->lkey };
	struct ibv_send_wr wr = {
		.wr_id = 61,
		.sg_list = &sge,
		.num_sge = 1,
		.opcode = IBV_WR_SEND,
		.send_flags = IBV_SEND_SIGNALED,
	};
	wr.wr.ud.ah = foreign;
	wr.wr.ud.remote_qpn = receiver->qp_num;
	wr.wr.ud.remote_qkey = UD_QKEY;
	struct ibv_send_wr *bad = NULL;
	int rc = ibv_post_send(sender, &wr, &bad);
	CHECKF(rc == EINVAL, "ibv_post_send with an AH of another PD returned %d, not EINVAL", rc);
	CHECKF(bad == &wr, "*bad_wr does not name the refused request");
	expect_none(scq);
	expect_none(rcq);
	wr.wr_id = 62;
	wr.wr.ud.ah = own;
	bad = NULL;
	CHECKF(ibv_post_send(sender, &wr, &bad) == 0, "ibv_post_send with an AH of the QP's PD");
	expect_one(scq, IBV_WC_SUCCESS, 62, sender->qp_num);
	expect_one(rcq, IBV_WC_SUCCESS, 60, receiver->qp_num);
	CHECKF(all_bytes(buf_a + DST + 40, MARK_A, LEN), "the datagram's payload differs");
	rule_ok("UD send with an address handle of another PD: EINVAL, nothing sent");

	CHECK(ibv_destroy_ah(foreign) == 0);
	CHECK(ibv_destroy_ah(own) == 0);
	CHECK(ibv_destroy_qp(sender) == 0);
	CHECK(ibv_destroy_qp(receiver) == 0);
	CHECK(ibv_destroy_cq(scq) == 0);
	CHECK(ibv_destroy_cq(rcq) == 0);
}

int main(void)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	signal(SIGALRM, watchdog);
	start_rule("setup");
	open_device();
	rule_ok("two PDs, a region in each");
	rules_rdma_write();
	rules_send();
	rule_wr_rdma_write();
	rule_ud_address_handle();
	start_rule("teardown");
	close_device();
	rule_ok("everything freed");
	printf("ok %d checks\n", checks);
	return 0;
}
