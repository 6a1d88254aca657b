/*
 * Attribute checks on the drop-in: every index and enum the kernel checks is refused with
 * the kernel's errno, and a refused ibv_modify_qp changes nothing (ibv_modify_qp(3): "If
 * any of the modify attributes or the modify mask are invalid, none of the attributes
 * will be modified (including the QP state)").
 *
 *   1 ibv_create_qp with a qp_type verbs.h does not define: NULL, EINVAL (the kernel's
 *     create_qp); with IBV_QPT_RAW_PACKET, a type the soft device does not offer:
 *     NULL, EOPNOTSUPP
 *   2 ibv_modify_qp to RTR with ah_attr.grh.sgid_index outside the GID table
 *     (ibv_query_port's gid_tbl_len): EINVAL, the QP stays in INIT; index 0 works
 *   3 ibv_modify_qp to INIT with port_num 2 or pkey_index 1: EINVAL (one port, one
 *     partition)
 *   4 ibv_modify_qp to RTR with a path_mtu verbs.h does not define, or max_dest_rd_atomic
 *     above ibv_query_device's max_qp_rd_atom: EINVAL, the QP stays in INIT
 *   5 ibv_create_ah with sgid_index outside the GID table, or port_num 2: NULL, EINVAL;
 *     index 0 works
 *   6 ibv_dealloc_pd(3) "fails if any other resource is still associated with the PD":
 *     EBUSY while a memory region, a queue pair, a shared receive queue or an address
 *     handle is in it, 0 once the last is destroyed
 *
 * Prints one "rule N ...: ok" line per rule and "ok <checks> checks" at the end.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <infiniband/verbs.h>

#include "rules.h"

static void rule_ok(const char *what)
{
	alarm(0);
	printf("rule %s: %s: ok\n", rule, what);
	fflush(stdout);
}

static enum ibv_qp_state state_of(struct ibv_qp *qp)
{
	struct ibv_qp_attr attr;
	struct ibv_qp_init_attr init;
	CHECK(ibv_query_qp(qp, &attr, IBV_QP_STATE, &init) == 0);
	return attr.qp_state;
}

static void to_init(struct ibv_qp *qp)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_INIT,
		.pkey_index = 0,
		.port_num = 1,
		.qp_access_flags = IBV_ACCESS_REMOTE_WRITE,
	};
	CHECK(ibv_modify_qp(qp, &a,
			    IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
				    IBV_QP_ACCESS_FLAGS) == 0);
}

static const int RTR_MASK = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
			    IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;

static struct ibv_qp_attr rtr(const union ibv_gid *gid, uint32_t remote)
{
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = remote;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = *gid;
	a.ah_attr.grh.hop_limit = 1;
	a.ah_attr.port_num = 1;
	return a;
}

int main(void)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	signal(SIGALRM, watchdog);
	start_rule("setup");
	struct ibv_context *context = open_softverbs0();
	struct ibv_pd *pd = ibv_alloc_pd(context);
	CHECK(pd != NULL);
	struct ibv_cq *cq = ibv_create_cq(context, 16, NULL, NULL, 0);
	CHECK(cq != NULL);
	struct ibv_port_attr port;
	CHECK(ibv_query_port(context, 1, &port) == 0);
	CHECK(port.gid_tbl_len >= 1 && port.gid_tbl_len < 99);
	struct ibv_device_attr device;
	CHECK(ibv_query_device(context, &device) == 0);
	union ibv_gid gid;
	CHECK(ibv_query_gid(context, 1, 0, &gid) == 0);
	struct ibv_qp_init_attr init = {
		.send_cq = cq,
		.recv_cq = cq,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
	};
	rule_ok("a PD, a CQ and the port's GID table");

	start_rule("1");
	struct ibv_qp_init_attr bad = init;
	bad.qp_type = (enum ibv_qp_type)0x77;
	errno = 0;
	CHECK(ibv_create_qp(pd, &bad) == NULL);
	CHECKF(errno == EINVAL, "unknown qp_type: errno %d, expected EINVAL", errno);
	bad.qp_type = IBV_QPT_RAW_PACKET;
	errno = 0;
	CHECK(ibv_create_qp(pd, &bad) == NULL);
	CHECKF(errno == EOPNOTSUPP, "raw packet QP: errno %d, expected EOPNOTSUPP", errno);
	rule_ok("an undefined qp_type is EINVAL, an unoffered one EOPNOTSUPP");

	struct ibv_qp *qp = ibv_create_qp(pd, &init);
	CHECK(qp != NULL);
	struct ibv_qp *peer = ibv_create_qp(pd, &init);
	CHECK(peer != NULL);

	start_rule("2");
	to_init(qp);
	struct ibv_qp_attr a = rtr(&gid, peer->qp_num);
	a.ah_attr.grh.sgid_index = 99;
	int rc = ibv_modify_qp(qp, &a, RTR_MASK);
	CHECKF(rc == EINVAL, "sgid_index 99: ibv_modify_qp gave %d, expected EINVAL", rc);
	a.ah_attr.grh.sgid_index = (uint8_t)port.gid_tbl_len;
	rc = ibv_modify_qp(qp, &a, RTR_MASK);
	CHECKF(rc == EINVAL, "sgid_index gid_tbl_len: ibv_modify_qp gave %d, expected EINVAL", rc);
	CHECK(state_of(qp) == IBV_QPS_INIT);
	a.ah_attr.grh.sgid_index = 0;
	rc = ibv_modify_qp(qp, &a, RTR_MASK);
	CHECKF(rc == 0, "sgid_index 0: ibv_modify_qp gave %d", rc);
	CHECK(state_of(qp) == IBV_QPS_RTR);
	rule_ok("sgid_index outside the GID table is EINVAL and changes nothing");

	start_rule("3");
	struct ibv_qp_attr i = {
		.qp_state = IBV_QPS_INIT,
		.pkey_index = 0,
		.port_num = 2,
		.qp_access_flags = 0,
	};
	const int INIT_MASK = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
	rc = ibv_modify_qp(peer, &i, INIT_MASK);
	CHECKF(rc == EINVAL, "port_num 2: %d, expected EINVAL", rc);
	i.port_num = 1;
	i.pkey_index = 1;
	rc = ibv_modify_qp(peer, &i, INIT_MASK);
	CHECKF(rc == EINVAL, "pkey_index 1: %d, expected EINVAL", rc);
	CHECK(state_of(peer) == IBV_QPS_RESET);
	rule_ok("port_num and pkey_index outside their tables are EINVAL");

	start_rule("4");
	to_init(peer);
	a = rtr(&gid, qp->qp_num);
	a.path_mtu = (enum ibv_mtu)9;
	rc = ibv_modify_qp(peer, &a, RTR_MASK);
	CHECKF(rc == EINVAL, "path_mtu 9: %d, expected EINVAL", rc);
	a = rtr(&gid, qp->qp_num);
	a.max_dest_rd_atomic = (uint8_t)(device.max_qp_rd_atom + 1);
	CHECK(device.max_qp_rd_atom < 255);
	rc = ibv_modify_qp(peer, &a, RTR_MASK);
	CHECKF(rc == EINVAL, "max_dest_rd_atomic %d: %d, expected EINVAL", a.max_dest_rd_atomic,
	       rc);
	CHECK(state_of(peer) == IBV_QPS_INIT);
	rule_ok("an undefined path_mtu and max_dest_rd_atomic above the device are EINVAL");

	start_rule("5");
	struct ibv_ah_attr ah = {
		.is_global = 1,
		.port_num = 1,
		.grh = { .dgid = gid, .sgid_index = 5, .hop_limit = 1 },
	};
	errno = 0;
	CHECK(ibv_create_ah(pd, &ah) == NULL);
	CHECKF(errno == EINVAL, "AH sgid_index 5: errno %d, expected EINVAL", errno);
	ah.grh.sgid_index = 0;
	ah.port_num = 2;
	errno = 0;
	CHECK(ibv_create_ah(pd, &ah) == NULL);
	CHECKF(errno == EINVAL, "AH port 2: errno %d, expected EINVAL", errno);
	ah.port_num = 1;
	struct ibv_ah *good = ibv_create_ah(pd, &ah);
	CHECK(good != NULL);
	CHECK(ibv_destroy_ah(good) == 0);
	rule_ok("an address handle outside the GID table or port is EINVAL");

	start_rule("6");
	struct ibv_pd *pd6 = ibv_alloc_pd(context);
	CHECK(pd6 != NULL);
	static char region[4096];
	struct ibv_mr *mr6 = ibv_reg_mr(pd6, region, sizeof(region), IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr6 != NULL);
	CHECKF((rc = ibv_dealloc_pd(pd6)) == EBUSY, "with an MR: %d, expected EBUSY", rc);
	CHECK(ibv_dereg_mr(mr6) == 0);
	struct ibv_qp *qp6 = ibv_create_qp(pd6, &init);
	CHECK(qp6 != NULL);
	CHECKF((rc = ibv_dealloc_pd(pd6)) == EBUSY, "with a QP: %d, expected EBUSY", rc);
	CHECK(ibv_destroy_qp(qp6) == 0);
	struct ibv_srq_init_attr srq_init = { .attr = { .max_wr = 4, .max_sge = 1 } };
	struct ibv_srq *srq6 = ibv_create_srq(pd6, &srq_init);
	CHECK(srq6 != NULL);
	CHECKF((rc = ibv_dealloc_pd(pd6)) == EBUSY, "with an SRQ: %d, expected EBUSY", rc);
	CHECK(ibv_destroy_srq(srq6) == 0);
	struct ibv_ah *ah6 = ibv_create_ah(pd6, &ah);
	CHECK(ah6 != NULL);
	CHECKF((rc = ibv_dealloc_pd(pd6)) == EBUSY, "with an AH: %d, expected EBUSY", rc);
	CHECK(ibv_destroy_ah(ah6) == 0);
	CHECKF((rc = ibv_dealloc_pd(pd6)) == 0, "with nothing in it: %d", rc);
	rule_ok("ibv_dealloc_pd is EBUSY while an MR, QP, SRQ or AH is in the PD");

	start_rule("teardown");
	CHECK(ibv_destroy_qp(qp) == 0);
	CHECK(ibv_destroy_qp(peer) == 0);
	CHECK(ibv_destroy_cq(cq) == 0);
	CHECK(ibv_dealloc_pd(pd) == 0);
	CHECK(ibv_close_device(context) == 0);
	rule_ok("everything freed");
	printf("ok %d checks\n", checks);
	return 0;
}
