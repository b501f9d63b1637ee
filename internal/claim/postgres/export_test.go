package postgres

// LockJobsExclusive is the probe's lock statement, for the tests.
const LockJobsExclusive = lockJobsExclusive
