/*
 * UD multicast on the drop-in (ibv_attach_mcast(3), ibv_detach_mcast(3); IBTA 10.5.2.2 and
 * Annex A17: a multicast GID is an IP multicast address, a multicast packet goes to QPN
 * 0xFFFFFF), through the real libibverbs entry points.
 *
 * One process, one device (softverbs0), one PD, one CQ. UD QPs with one Q_Key: `tx`
 * sends; `r1`, `r2` attach to the group, `r3` does not; `rx_other` has another Q_Key.
 *
 *   1 ibv_query_device(3): max_mcast_grp, max_mcast_qp_attach and
 *     max_total_mcast_qp_attach are not 0 (rxe's limits: 8192, 56, 0x70000)
 *   2 ibv_attach_mcast(3) returns the errno: EINVAL for an RC QP (the kernel's
 *     ib_attach_mcast: UD only), for a GID that is not multicast (the device's own), and
 *     for a NULL GID; ibv_detach_mcast of a QP not attached: EINVAL
 *   3 a UD send to the group (address handle to the multicast GID, remote QPN 0xFFFFFF)
 *     reaches r1 and r2, each once though r2 attached twice (attaching again is 0), with
 *     IBV_WC_GRH and the group as the destination of the GRH area's IPv4 header; r3 (not
 *     attached) and rx_other (attached, another Q_Key) get nothing
 *   4 ibv_destroy_qp(3) of an attached QP is EBUSY (the kernel's uverbs_free_qp); after
 *     ibv_detach_mcast it is 0, and the QP no longer receives the group
 *
 * Prints one "rule N: ...: ok" line per rule and "ok <checks> checks" at the end; exits 1
 * with "FAIL rule N" on stderr at the first failed check. Every wait is bounded.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <infiniband/verbs.h>

#include "rules.h"

#define QKEY 0x11110000u
#define SLOT 2048
#define MULTICAST_QPN 0xFFFFFFu

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_cq *cq;
static union ibv_gid own_gid, group;
static unsigned char *buf;
static struct ibv_mr *mr;
static struct ibv_qp *tx, *r1, *r2, *r3, *rx_other;

static void rule_ok(const char *what)
{
	alarm(0);
	printf("rule %s: %s: ok\n", rule, what);
	fflush(stdout);
}

static struct ibv_qp *ud_qp(uint32_t qkey)
{
	struct ibv_qp_init_attr attr = {
		.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_UD, .sq_sig_all = 1,
		.cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1,
			 .max_recv_sge = 1, .max_inline_data = 64 },
	};
	struct ibv_qp *qp = ibv_create_qp(pd, &attr);
	CHECKF(qp != NULL, "ibv_create_qp(UD)");
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1,
				 .qkey = qkey };
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
					    IBV_QP_QKEY) == 0);
	a.qp_state = IBV_QPS_RTR;
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE) == 0);
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = 0;
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN) == 0);
	return qp;
}

/* A receive of SLOT bytes into slot `n` of the region, wr_id n. */
static void post_recv_slot(struct ibv_qp *qp, int n)
{
	struct ibv_sge sge = { .addr = (uintptr_t)(buf + n * SLOT), .length = SLOT,
			       .lkey = mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = (uint64_t)n, .sg_list = &sge, .num_sge = 1 }, *bad;
	CHECK(ibv_post_recv(qp, &wr, &bad) == 0);
}

/* Sends `text` inline from `tx` to the group and waits for the send's completion. */
static void send_to_group(struct ibv_ah *ah, const char *text, uint64_t wr_id)
{
	struct ibv_sge sge = { .addr = (uintptr_t)text, .length = (uint32_t)strlen(text) };
	struct ibv_send_wr wr = {
		.wr_id = wr_id, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
		.send_flags = IBV_SEND_INLINE | IBV_SEND_SIGNALED,
		.wr.ud = { .ah = ah, .remote_qpn = MULTICAST_QPN, .remote_qkey = QKEY },
	}, *bad;
	CHECK(ibv_post_send(tx, &wr, &bad) == 0);
	struct ibv_wc wc;
	CHECKF(poll_until(cq, 1, &wc, WAIT_MS) == 1, "the send's completion");
	CHECKF(wc.status == IBV_WC_SUCCESS && wc.wr_id == wr_id && wc.qp_num == tx->qp_num,
	       "send completion: status %s wr_id %" PRIu64, ibv_wc_status_str(wc.status),
	       wc.wr_id);
}

/* Collects the receive completions that arrive within QUIET_MS after `want` came. */
static int receives(struct ibv_wc *wcs, int max, int want)
{
	int got = poll_until(cq, want, wcs, WAIT_MS);
	CHECKF(got >= want, "%d of %d receive completions", got, want);
	struct ibv_wc extra;
	while (got < max && poll_until(cq, 1, &extra, QUIET_MS) == 1)
		wcs[got++] = extra;
	return got;
}

static struct ibv_ah *group_ah(void)
{
	struct ibv_ah_attr attr = { .is_global = 1, .port_num = 1,
				    .grh = { .dgid = group, .sgid_index = 0, .hop_limit = 1 } };
	struct ibv_ah *ah = ibv_create_ah(pd, &attr);
	CHECKF(ah != NULL, "ibv_create_ah(multicast GID)");
	return ah;
}

static void rule_limits(void)
{
	start_rule("1");
	struct ibv_device_attr attr;
	CHECK(ibv_query_device(ctx, &attr) == 0);
	CHECKF(attr.max_mcast_grp > 0 && attr.max_mcast_qp_attach > 0 &&
		       attr.max_total_mcast_qp_attach > 0,
	       "max_mcast_grp %d, max_mcast_qp_attach %d, max_total_mcast_qp_attach %d",
	       attr.max_mcast_grp, attr.max_mcast_qp_attach, attr.max_total_mcast_qp_attach);
	rule_ok("ibv_query_device(3): the multicast limits are not 0");
}

static void rule_refusals(void)
{
	start_rule("2");
	struct ibv_qp_init_attr attr = {
		.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	struct ibv_qp *rc = ibv_create_qp(pd, &attr);
	CHECK(rc != NULL);
	CHECKF(ibv_attach_mcast(rc, &group, 0) == EINVAL, "RC QP: EINVAL");
	CHECK(ibv_destroy_qp(rc) == 0);
	CHECKF(ibv_attach_mcast(r1, &own_gid, 0) == EINVAL, "unicast GID: EINVAL");
	CHECKF(ibv_attach_mcast(r1, NULL, 0) == EINVAL, "NULL GID: EINVAL");
	CHECKF(ibv_detach_mcast(r1, &group, 0) == EINVAL, "detach, not attached: EINVAL");
	rule_ok("ibv_attach_mcast(3): EINVAL for an RC QP, a unicast or NULL GID; detach of a "
		"QP not attached: EINVAL");
}

static void rule_delivery(struct ibv_ah *ah)
{
	start_rule("3");
	CHECK(ibv_attach_mcast(r1, &group, 0) == 0);
	CHECK(ibv_attach_mcast(r2, &group, 0) == 0);
	CHECKF(ibv_attach_mcast(r2, &group, 0) == 0, "attaching again: 0");
	CHECK(ibv_attach_mcast(rx_other, &group, 0) == 0);
	post_recv_slot(r1, 1);
	post_recv_slot(r2, 2);
	post_recv_slot(r3, 3);
	post_recv_slot(rx_other, 4);
	memset(buf, 0, 5 * SLOT);
	send_to_group(ah, "to the group", 30);
	struct ibv_wc wcs[8];
	int got = receives(wcs, 8, 2);
	CHECKF(got == 2, "%d receive completions, expected r1's and r2's only", got);
	int seen_r1 = 0, seen_r2 = 0;
	for (int i = 0; i < got; i++) {
		struct ibv_wc *wc = &wcs[i];
		CHECKF(wc->status == IBV_WC_SUCCESS && wc->opcode == IBV_WC_RECV,
		       "receive: status %s opcode %d", ibv_wc_status_str(wc->status), wc->opcode);
		CHECKF(wc->qp_num == r1->qp_num || wc->qp_num == r2->qp_num,
		       "a receive on QP %u, which is not attached (or has another Q_Key)",
		       wc->qp_num);
		seen_r1 += wc->qp_num == r1->qp_num;
		seen_r2 += wc->qp_num == r2->qp_num;
		CHECK(wc->src_qp == tx->qp_num);
		CHECK(wc->wc_flags & IBV_WC_GRH);
		CHECK(wc->byte_len == 40 + strlen("to the group"));
		unsigned char *slot = buf + wc->wr_id * SLOT;
		CHECKF(memcmp(slot + 36, &group.raw[12], 4) == 0,
		       "the GRH area's IPv4 destination is the group");
		CHECK(memcmp(slot + 40, "to the group", 12) == 0);
	}
	CHECK(seen_r1 == 1 && seen_r2 == 1);
	rule_ok("a send to QPN 0xFFFFFF reaches each attached QP once, with the group in the "
		"GRH; not a QP not attached, nor one with another Q_Key");
}

static void rule_destroy(struct ibv_ah *ah)
{
	start_rule("4");
	CHECKF(ibv_destroy_qp(r2) == EBUSY, "destroying an attached QP: EBUSY");
	CHECK(ibv_detach_mcast(r2, &group, 0) == 0);
	CHECKF(ibv_detach_mcast(r2, &group, 0) == EINVAL, "detaching twice: EINVAL");
	/* A receive on r2, detached, and on r1, still attached: only r1's completes. */
	post_recv_slot(r2, 2);
	post_recv_slot(r1, 1);
	send_to_group(ah, "after detach", 40);
	struct ibv_wc wcs[8];
	int got = receives(wcs, 8, 1);
	CHECKF(got == 1 && wcs[0].qp_num == r1->qp_num,
	       "%d receives (first on QP %u): only r1 is still attached", got, wcs[0].qp_num);
	CHECK(ibv_destroy_qp(r2) == 0);
	r2 = NULL;
	CHECK(ibv_detach_mcast(r1, &group, 0) == 0);
	CHECK(ibv_detach_mcast(rx_other, &group, 0) == 0);
	rule_ok("ibv_destroy_qp(3) of an attached QP: EBUSY; detached, it leaves the group and "
		"is destroyed");
}

int main(void)
{
	signal(SIGALRM, watchdog);
	setvbuf(stdout, NULL, _IOLBF, 0);
	start_rule("setup");
	ctx = open_softverbs0();
	CHECK(ibv_query_gid(ctx, 1, 0, &own_gid) == 0);
	/* ::ffff:239.255.18.1 */
	memset(&group, 0, sizeof(group));
	group.raw[10] = 0xff;
	group.raw[11] = 0xff;
	group.raw[12] = 239;
	group.raw[13] = 255;
	group.raw[14] = 18;
	group.raw[15] = 1;
	pd = ibv_alloc_pd(ctx);
	CHECK(pd != NULL);
	cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	CHECK(cq != NULL);
	buf = aligned_alloc(4096, 8 * SLOT);
	CHECK(buf != NULL);
	mr = ibv_reg_mr(pd, buf, 8 * SLOT, IBV_ACCESS_LOCAL_WRITE);
	CHECKF(mr != NULL, "ibv_reg_mr");
	tx = ud_qp(QKEY);
	r1 = ud_qp(QKEY);
	r2 = ud_qp(QKEY);
	r3 = ud_qp(QKEY);
	rx_other = ud_qp(QKEY + 1);
	struct ibv_ah *ah = group_ah();
	rule_ok("a device, a CQ, five UD QPs, an address handle to ::ffff:239.255.18.1");
	rule_limits();
	rule_refusals();
	rule_delivery(ah);
	rule_destroy(ah);
	start_rule("teardown");
	CHECK(ibv_destroy_ah(ah) == 0);
	CHECK(ibv_destroy_qp(tx) == 0);
	CHECK(ibv_destroy_qp(r1) == 0);
	CHECK(ibv_destroy_qp(r3) == 0);
	CHECK(ibv_destroy_qp(rx_other) == 0);
	CHECK(ibv_destroy_cq(cq) == 0);
	CHECK(ibv_dereg_mr(mr) == 0);
	CHECK(ibv_dealloc_pd(pd) == 0);
	CHECK(ibv_close_device(ctx) == 0);
	free(buf);
	rule_ok("everything destroyed");
	printf("ok %d checks\n", checks);
	return 0;
}
