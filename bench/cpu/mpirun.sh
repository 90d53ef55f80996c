# mpirun.sh: sourced by the Open MPI sides of this folder's benches
# (loaded.sh, paired.sh, peers.d/mpi-alltoallv.sh). Sets MPIRUN to the way
# ../shared/peers/run.sh runs its own mpi_bench: shared memory, every rank
# unpinned, the runtime on loopback; as root, with Open MPI's consent.
MPIRUN=(mpirun --oversubscribe --bind-to none --mca oob_tcp_if_include lo --mca btl_tcp_if_include lo)
if [ "$(id -u)" -eq 0 ]; then
  MPIRUN+=(--allow-run-as-root)
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
