// Command counter is a stand-in for loam's agent in the gvisor driver's
// tests. Run as "counter agent", it listens on TCP port 8080 and answers
// each connection with one JSON line holding a counter that only lives in
// its memory, so a test can tell a restored process (the count goes on)
// from a fresh one (it starts again at 1). With COUNTER_ALLOC_MIB=N it
// first fills N MiB of memory with random bytes, for benchmarks.
package main

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
)

type reply struct {
	N        int      `json:"n"`
	PID      int      `json:"pid"`
	UID      int      `json:"uid"`
	Hostname string   `json:"hostname"`
	Env      []string `json:"env"`
	Args     []string `json:"args"`
}

// ballast keeps the allocated memory alive.
var ballast []byte

func main() {
	// Like the real agent: a reader of our stdout that went away must not
	// kill us.
	signal.Ignore(syscall.SIGPIPE)
	if mib, _ := strconv.Atoi(os.Getenv("COUNTER_ALLOC_MIB")); mib > 0 {
		ballast = make([]byte, mib<<20)
		r := rand.NewChaCha8([32]byte{1})
		_, _ = r.Read(ballast)
	}
	ln, err := net.Listen("tcp", ":8080")
	if err != nil {
		fmt.Fprintln(os.Stderr, "counter: listen:", err)
		os.Exit(1)
	}
	fmt.Println("counter: listening")
	var (
		mu sync.Mutex
		n  int
	)
	for {
		c, err := ln.Accept()
		if err != nil {
			fmt.Fprintln(os.Stderr, "counter: accept:", err)
			continue
		}
		mu.Lock()
		n++
		r := reply{N: n, PID: os.Getpid(), UID: os.Getuid(), Env: os.Environ(), Args: os.Args}
		mu.Unlock()
		r.Hostname, _ = os.Hostname()
		_ = json.NewEncoder(c).Encode(r)
		_ = c.Close()
		fmt.Printf("counter: served %d\n", r.N)
	}
}
