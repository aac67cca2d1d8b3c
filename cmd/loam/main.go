// Command loam is loam's one binary: the CLI, the daemon (loam serve) and,
// inside each sandbox, the agent (loam agent).
package main

func main() {}
