// Package network gives each sandbox its own network namespace: a veth pair
// whose host end has the first address of a /30 from the daemon's subnet and
// whose sandbox end (eth0 in the namespace) has the second, with a default
// route through the host end. gVisor (--network=sandbox) moves the
// namespace's addresses and routes into its own network stack when a
// container starts or is restored, and deletes them from the namespace, so
// Prepare must run before every start and every restore.
package network
