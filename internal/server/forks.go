package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"runtime/debug"
	"slices"

	"golang.org/x/sync/errgroup"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/auth"
	"loam.dev/loam/internal/sandbox"
)

// forksAtOnce is how many forks of a count are made at a time. Each is a
// restore of the checkpoint, heavy on the disk and the host's memory while
// it runs: the others wait their turn rather than all compete at once.
const forksAtOnce = 4

// createForks makes the req.Count forks of a create with a count, each as
// a create of one fork: a call of its own through the server's root
// handler, with the caller's own credentials, so that each one is
// authorized, placed (in a cluster, on the node placement picks for it
// alone), audited (one sandbox.fork record each) and answered as a single
// fork would be. The answer lists them in order, each with its sandbox or
// its error; when none was made, it is the first fork's error, so that a
// source or checkpoint that does not exist answers as for one fork.
func (sr *sandboxRoutes) createForks(w http.ResponseWriter, r *http.Request, req api.CreateSandbox) error {
	if err := checkCount(r, req); err != nil {
		return err
	}
	forks := make([]api.ForkResult, req.Count)
	var g errgroup.Group
	g.SetLimit(forksAtOnce)
	for i := range forks {
		one := req
		one.Count = 0
		if req.Name != "" {
			one.Name = fmt.Sprintf("%s-%d", req.Name, i+1)
		}
		forks[i].Name = one.Name
		g.Go(func() error {
			forks[i].Sandbox, forks[i].Error = sr.forkOne(r, one)
			return nil
		})
	}
	_ = g.Wait()
	if !slices.ContainsFunc(forks, func(f api.ForkResult) bool { return f.Sandbox != nil }) {
		return forks[0].Error
	}
	api.WriteJSON(w, http.StatusCreated, api.ForkList{Forks: forks})
	return nil
}

// checkCount refuses a count that makes no sense, before any fork is made:
// one without from, one out of range, or one whose names (NAME-1 …
// NAME-N) are no sandbox's names.
func checkCount(r *http.Request, req api.CreateSandbox) error {
	switch {
	case req.Count < 0 || req.Count > api.MaxForkCount:
		return api.Errorf(api.CodeInvalid, "count: %d; a create makes 1 to %d forks at once", req.Count, api.MaxForkCount)
	case req.From == nil:
		return api.Errorf(api.CodeInvalid, "count: only a fork (from) makes several sandboxes at once; create the others one by one")
	case req.Name == "":
		return nil
	}
	p, _ := auth.From(r.Context())
	// The names differ only in their number: the last is the longest.
	last := fmt.Sprintf("%s-%d", req.Name, req.Count)
	err := sandbox.CheckName(last, p.Org)
	var ae *api.Error
	if errors.As(err, &ae) {
		return api.Errorf(ae.Code, "count: the forks are named %s-1 … %s; %s", req.Name, last, ae.Message)
	}
	return err
}

// forkOne makes fork req, one of a count's, as its own call to the
// server's root handler (see createForks), and reads the answer back: the
// sandbox made, or the error. The call is r's (its credentials, client,
// context) with req as its body.
func (sr *sandboxRoutes) forkOne(r *http.Request, req api.CreateSandbox) (sb *api.Sandbox, ae *api.Error) {
	defer func() {
		// A goroutine's panic would end the daemon: net/http recovers only
		// the handler's own.
		if p := recover(); p != nil {
			if p == http.ErrAbortHandler {
				// The client went away (see writeError).
				sb, ae = nil, api.Errorf(api.CodeUnavailable, "the call ended before this fork was made")
				return
			}
			sr.log.Error("a fork of a count panicked", "request_id", RequestID(r.Context()), "panic", p, "stack", string(debug.Stack()))
			sb, ae = nil, api.Errorf(api.CodeInternal, "internal error (request id %s)", RequestID(r.Context()))
		}
	}()
	body, err := json.Marshal(req)
	if err != nil {
		return nil, api.Errorf(api.CodeInternal, "encoding a fork: %v", err)
	}
	sub := r.Clone(r.Context())
	sub.Body = io.NopCloser(bytes.NewReader(body))
	sub.ContentLength = int64(len(body))
	sub.GetBody = nil
	sub.TransferEncoding = nil
	sub.Header.Del("Content-Length")
	sub.Header.Set("Content-Type", "application/json")
	ans := &recorded{header: http.Header{}}
	sr.root.ServeHTTP(ans, sub)
	return ans.fork()
}

// fork reads a recorded create: the sandbox it made (201), or its error.
func (a *recorded) fork() (*api.Sandbox, *api.Error) {
	if a.status == http.StatusCreated {
		var sb api.Sandbox
		if err := json.Unmarshal(a.body.Bytes(), &sb); err != nil || sb.ID == "" {
			return nil, api.Errorf(api.CodeInternal, "the fork's answer is no sandbox: %.200q", a.body.Bytes())
		}
		return &sb, nil
	}
	var eb api.ErrorBody
	if err := json.Unmarshal(a.body.Bytes(), &eb); err == nil && eb.Error != nil && eb.Error.Code != "" {
		return nil, eb.Error
	}
	return nil, api.Errorf(api.CodeForStatus(a.status), "the fork's call answered %d without an error body", a.status)
}
