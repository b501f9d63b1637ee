// Package redlock is a claim.Claimer over N independent Redis servers: a
// claim is won on a majority (N/2+1) of them within the lease's validity
// time. Each server runs the same Lua scripts, with the same key layout, as
// in package redis (both use package redisnode); this package only counts
// their votes. How it does so is set out in docs/architecture.md ("Redlock
// design notes").
package redlock
