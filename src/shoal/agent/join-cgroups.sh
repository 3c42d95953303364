# join-cgroups.sh CGROUP_PROCS... -- COMMAND [ARG...]
# Moves itself into each cgroup whose cgroup.procs is named, then execs COMMAND: the command
# and all it starts are inside before it runs a line. The agent starts a batch supervisor (and
# a pod's container's) through it: a Python preexec_fn would make subprocess fork the whole
# agent instead of vfork-ing it (~30 ms against ~1 ms; BENCHMARKS.md, "Cgroups").
# A fixed script: everything it is given is an argument, never code.
while [ "$1" != -- ]; do
    echo 0 > "$1" || exit 126
    shift
done
shift
exec "$@"
