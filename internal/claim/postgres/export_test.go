package postgres

// TakeOverRun is the takeover statement, for tests of what it decides.
const TakeOverRun = takeOverRun
