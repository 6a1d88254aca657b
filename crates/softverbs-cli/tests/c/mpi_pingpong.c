/* An MPI ping-pong over 2 ranks: rank 0 sends an 8-byte message carrying a count and
 * rank 1 answers with the count plus one, checked; ITERS round trips (argv[1], default
 * 1000), twice, and rank 0 prints the half round trip of the second pass. Used by the
 * Open MPI tests (crates/softverbs-cli/tests/openmpi.rs) and scripts/bench-mpi.sh. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    int rank, size, iters = argc > 1 ? atoi(argv[1]) : 1000;
    char buf[8] = {0};
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size != 2) {
        fprintf(stderr, "needs 2 ranks\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    for (int pass = 0; pass < 2; pass++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (int i = 0; i < iters; i++) {
            int v;
            if (rank == 0) {
                memcpy(buf, &i, sizeof i);
                MPI_Send(buf, 8, MPI_CHAR, 1, 7, MPI_COMM_WORLD);
                MPI_Recv(buf, 8, MPI_CHAR, 1, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                memcpy(&v, buf, sizeof v);
                if (v != i + 1) {
                    fprintf(stderr, "reply %d to %d\n", v, i);
                    MPI_Abort(MPI_COMM_WORLD, 3);
                }
            } else {
                MPI_Recv(buf, 8, MPI_CHAR, 0, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                memcpy(&v, buf, sizeof v);
                v++;
                memcpy(buf, &v, sizeof v);
                MPI_Send(buf, 8, MPI_CHAR, 0, 7, MPI_COMM_WORLD);
            }
        }
        double t1 = MPI_Wtime();
        if (rank == 0 && pass == 1)
            printf("pingpong ok: %d round trips, half round trip %.2f us\n", iters,
                   (t1 - t0) * 1e6 / iters / 2);
    }
    MPI_Finalize();
    return 0;
}
