// Package redis is a claim.Claimer over one Redis server, or one Redis
// Cluster (go-redis/v9; a *goredis.ClusterClient).
// The scripts it runs, and what it shares with package redlock, are in
// package redisnode. How it works — key layout, fences, restarts, limits —
// is set out in docs/architecture.md ("Redis design notes").
package redis
