package etcd

// Exported for the external tests, which may use claimtest (it imports
// this package).
var UnseenGrant = unseenGrant
