#!/usr/bin/env bash
# netns-cluster.sh — a bandwidth-limited "cluster" of N network namespaces on one machine,
# so P processes talk over a real, shaped network instead of loopback.
#
#   sudo scripts/netns-cluster.sh up N RATE     e.g.  up 4 1gbit   (RATE in tc units: kbit, mbit, gbit)
#   sudo scripts/netns-cluster.sh down
#   sudo scripts/netns-cluster.sh status
#
# Requires root (CAP_NET_ADMIN and CAP_SYS_ADMIN), iproute2 (ip, tc) and the kernel's veth,
# bridge and sch_htb (or sch_tbf) support. Tests never run it.
#
# Layout: namespaces spargo0 … spargo<N-1>; in each, eth0 = 10.77.0.<i+1>/24 is one end of a
# veth pair whose other end (spg<i>) is a port of the bridge spgbr0 in the root namespace.
# Every veth end is shaped to RATE on egress (htb, or tbf with SHAPER=tbf), so each namespace
# sends at most RATE and receives at most RATE: the per-node NIC bandwidth of a real cluster.
# netem (latency) is not available in these kernels; only rate is shaped.
#
# Run a job across the namespaces (rank 0's store is at 10.77.0.1):
#
#   for r in 0 1 2 3; do
#     ip netns exec spargo$r env RANK=$r WORLD_SIZE=4 LOCAL_RANK=0 SPARGO_NODE=spargo$r \
#       MASTER_ADDR=10.77.0.1 MASTER_PORT=29500 SPARGO_SECRET=$SECRET ./train … &
#   done; wait
#
# The namespaces reach nothing outside the bridge (no route, no NAT).
#
# Two clusters can exist at once when they differ in all four names (environment, the
# defaults in brackets): NETNS_PREFIX [spargo] names the namespaces, NETNS_BRIDGE [spgbr0]
# the bridge, NETNS_VETH [spg] the host ends of the veth pairs (at most 11 characters), and
# NETNS_SUBNET [10.77.0] the /24. Give `down` and `status` the same variables, e.g.
#
#   NETNS_PREFIX=spargoc NETNS_BRIDGE=spgbrc NETNS_VETH=spgc NETNS_SUBNET=10.78.0 \
#     scripts/netns-cluster.sh up 8 200mbit
set -euo pipefail

PREFIX=${NETNS_PREFIX:-spargo}
BRIDGE=${NETNS_BRIDGE:-spgbr0}
SUBNET=${NETNS_SUBNET:-10.77.0}
VETH=${NETNS_VETH:-spg}
SHAPER=${SHAPER:-htb}

die() { echo "netns-cluster: $*" >&2; exit 1; }

need_root() {
	[ "$(id -u)" -eq 0 ] || die "must run as root (network namespaces and tc need CAP_NET_ADMIN)"
	command -v ip >/dev/null || die "ip (iproute2) not found"
	command -v tc >/dev/null || die "tc (iproute2) not found"
}

# shape DEV RATE [NETNS]: egress rate limit on DEV.
shape() {
	local dev=$1 rate=$2 ns=${3:-}
	local tcx=(tc)
	[ -n "$ns" ] && tcx=(ip netns exec "$ns" tc)
	case $SHAPER in
	htb)
		"${tcx[@]}" qdisc replace dev "$dev" root handle 1: htb default 10
		"${tcx[@]}" class replace dev "$dev" parent 1: classid 1:10 htb rate "$rate" ceil "$rate" quantum 60000 # one class: quantum only silences a warning
		;;
	tbf)
		# burst: 10 ms at RATE, at least 32 kB (tbf needs burst >= rate/HZ).
		local bits
		bits=$(rate_bits "$rate")
		local burst=$((bits / 8 / 100))
		[ "$burst" -lt 32768 ] && burst=32768
		"${tcx[@]}" qdisc replace dev "$dev" root tbf rate "$rate" burst "$burst" latency 50ms
		;;
	*) die "SHAPER must be htb or tbf, not $SHAPER" ;;
	esac
}

# rate_bits RATE: tc rate string → bits per second.
rate_bits() {
	local r=${1,,}
	case $r in
	*gbit) echo $(( ${r%gbit} * 1000000000 )) ;;
	*mbit) echo $(( ${r%mbit} * 1000000 )) ;;
	*kbit) echo $(( ${r%kbit} * 1000 )) ;;
	*bit) echo "${r%bit}" ;;
	*) die "rate $1: use kbit, mbit or gbit (whole numbers), e.g. 1gbit" ;;
	esac
}

# wait_gone DEV: the kernel removes a deleted namespace's veth pair asynchronously, so right
# after a `down` a host end may still exist for a moment; wait up to 10 s for DEV to vanish.
wait_gone() {
	local dev=$1
	for ((t = 0; t < 100; t++)); do
		ip link show "$dev" >/dev/null 2>&1 || return 0
		sleep 0.1
	done
	die "$dev still exists 10 s after its namespace was deleted: run '$0 down' (same NETNS_* variables) and retry"
}

up() {
	local n=${1:-} rate=${2:-}
	[[ $n =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le 250 ] || die "N must be 1..250 (got '${n}')"
	[ -n "$rate" ] || die "usage: $0 up N RATE (e.g. up 4 1gbit)"
	[[ $PREFIX =~ ^[A-Za-z][A-Za-z0-9_-]*$ && $BRIDGE =~ ^[A-Za-z][A-Za-z0-9_-]{0,14}$ && $VETH =~ ^[A-Za-z][A-Za-z0-9_-]{0,10}$ ]] ||
		die "NETNS_PREFIX, NETNS_BRIDGE (≤ 15 characters) and NETNS_VETH (≤ 11) must be names of letters, digits, _ and -"
	[[ $SUBNET =~ ^[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}$ ]] || die "NETNS_SUBNET must be the first three octets of a /24, e.g. 10.77.0 (got '$SUBNET')"
	rate_bits "$rate" >/dev/null
	need_root
	if ip link show "$BRIDGE" >/dev/null 2>&1; then
		die "$BRIDGE exists: run '$0 down' first"
	fi
	ip link add "$BRIDGE" type bridge
	ip link set "$BRIDGE" up
	# Bridged frames must not go through iptables (br_netfilter would filter them).
	if [ -e /proc/sys/net/bridge/bridge-nf-call-iptables ]; then
		echo 0 >/proc/sys/net/bridge/bridge-nf-call-iptables
	fi
	for ((i = 0; i < n; i++)); do
		local ns=$PREFIX$i host=$VETH$i peer=$VETH${i}n
		wait_gone "$host"
		ip netns add "$ns"
		ip link add "$host" type veth peer name "$peer"
		ip link set "$peer" netns "$ns"
		ip -n "$ns" link set "$peer" name eth0
		ip -n "$ns" addr add "$SUBNET.$((i + 1))/24" dev eth0
		ip -n "$ns" link set lo up
		ip -n "$ns" link set eth0 up
		ip link set "$host" master "$BRIDGE"
		ip link set "$host" up
		shape "$host" "$rate"      # bridge → namespace: what the node receives
		shape eth0 "$rate" "$ns"   # namespace → bridge: what the node sends
	done
	echo "netns-cluster: $n namespaces ${PREFIX}0..${PREFIX}$((n - 1)) at $SUBNET.1..$SUBNET.$n, $rate each way ($SHAPER)"
}

down() {
	need_root
	local found=0
	for ns in $(ip netns list | awk '{print $1}' | grep -E "^${PREFIX}[0-9]+$" || true); do
		ip netns del "$ns" # deletes its veth pair too, asynchronously
		wait_gone "$VETH${ns#"$PREFIX"}"
		found=$((found + 1))
	done
	if ip link show "$BRIDGE" >/dev/null 2>&1; then
		ip link del "$BRIDGE"
	fi
	echo "netns-cluster: removed $found namespaces and $BRIDGE"
}

status() {
	ip netns list | grep -E "^${PREFIX}[0-9]+" || echo "no ${PREFIX}* namespaces"
	ip -br link show "$BRIDGE" 2>/dev/null || true
	tc qdisc show 2>/dev/null | grep -E "dev $VETH[0-9]+ " || true
}

case ${1:-} in
up) up "${2:-}" "${3:-}" ;;
down) down ;;
status) status ;;
*) die "usage: $0 up N RATE | down | status" ;;
esac
