// Package redisnode holds what the redis and redlock claimers share: a
// Node runs the claim scripts (Lua, go-redis/v9) against one Redis server
// and reports what that server said, and reads its history; MarkNew
// declares a namespace new. Package redis decides on the answer of one
// Node, package redlock on the answers of several. The key layout, the
// scripts and the restart guard are described in package redis.
package redisnode
