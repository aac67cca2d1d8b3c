package client

import (
	"context"
	"fmt"
	"io"
	"net/http"

	"github.com/coder/websocket"

	"loam.dev/loam/api"
)

// Services (api/service.go): named, supervised commands of a sandbox, kept
// on its disk, restarted as their policy says, with their output kept in
// buffers addressed by byte offsets.

// PutService defines (or redefines) service def.Name of sandbox and starts
// it. A redefined service is stopped first.
func (c *Client) PutService(ctx context.Context, sandbox string, def api.Service) (*api.ServiceStatus, error) {
	var s api.ServiceStatus
	if err := c.serviceCall(ctx, http.MethodPut, sandbox, def.Name, "", def, &s); err != nil {
		return nil, fmt.Errorf("defining service %s of %s: %w", def.Name, sandbox, err)
	}
	return &s, nil
}

// ListServices lists sandbox's services, by name.
func (c *Client) ListServices(ctx context.Context, sandbox string) ([]api.ServiceStatus, error) {
	var l api.ServiceList
	if err := c.sandboxCall(ctx, http.MethodGet, sandbox, "/services", nil, &l); err != nil {
		return nil, fmt.Errorf("listing services of %s: %w", sandbox, err)
	}
	if l.Services == nil {
		l.Services = []api.ServiceStatus{}
	}
	return l.Services, nil
}

// GetService returns service name of sandbox: its definition, state, pid,
// restarts and last exit code.
func (c *Client) GetService(ctx context.Context, sandbox, name string) (*api.ServiceStatus, error) {
	var s api.ServiceStatus
	if err := c.serviceCall(ctx, http.MethodGet, sandbox, name, "", nil, &s); err != nil {
		return nil, fmt.Errorf("getting service %s of %s: %w", name, sandbox, err)
	}
	return &s, nil
}

// StartService starts service name (a running one is left as it is), and
// keeps it to be started on the sandbox's next fresh boot.
func (c *Client) StartService(ctx context.Context, sandbox, name string) (*api.ServiceStatus, error) {
	return c.serviceAction(ctx, sandbox, name, api.ServiceStart)
}

// StopService stops service name (SIGTERM to its process group, SIGKILL
// after a grace) and returns once it has exited; it stays stopped, on the
// sandbox's next fresh boot too, until started.
func (c *Client) StopService(ctx context.Context, sandbox, name string) (*api.ServiceStatus, error) {
	return c.serviceAction(ctx, sandbox, name, api.ServiceStop)
}

// RestartService stops service name, if it runs, and starts it again.
func (c *Client) RestartService(ctx context.Context, sandbox, name string) (*api.ServiceStatus, error) {
	return c.serviceAction(ctx, sandbox, name, api.ServiceRestart)
}

func (c *Client) serviceAction(ctx context.Context, sandbox, name, action string) (*api.ServiceStatus, error) {
	var s api.ServiceStatus
	if err := c.serviceCall(ctx, http.MethodPost, sandbox, name, "/"+action, nil, &s); err != nil {
		return nil, fmt.Errorf("%s service %s of %s: %w", action, name, sandbox, err)
	}
	return &s, nil
}

// DeleteService stops service name and forgets it.
func (c *Client) DeleteService(ctx context.Context, sandbox, name string) error {
	if err := c.serviceCall(ctx, http.MethodDelete, sandbox, name, "", nil, nil); err != nil {
		return fmt.Errorf("deleting service %s of %s: %w", name, sandbox, err)
	}
	return nil
}

func (c *Client) serviceCall(ctx context.Context, method, sandbox, name, rest string, in, out any) error {
	seg, err := segment("service", name)
	if err != nil {
		return err
	}
	return c.sandboxCall(ctx, method, sandbox, "/services/"+seg+rest, in, out)
}

// ServiceLogsOptions says where a service's logs start and where they go.
type ServiceLogsOptions struct {
	// Offset is the byte offset of stdout to start from, StderrOffset
	// stderr's (Offset's when nil); nil starts from the oldest byte still
	// buffered. A reader that comes back gives the offsets it reached
	// (see OnOffset) to get only what it has not seen.
	Offset, StderrOffset *int64
	Stdout, Stderr       io.Writer
	// Follow goes on writing new output, across the service's restarts,
	// until ctx ends; else ServiceLogs returns once what was buffered is
	// written.
	Follow bool
	// OnOffset is as AttachOptions.OnOffset.
	OnOffset func(stream byte, offset, dropped int64)
}

// ServiceLogs writes the logs of service name of sandbox. When the sandbox
// is checkpointed or restored while following, the error wraps
// ErrInterrupted: read again from the offsets reached.
func (c *Client) ServiceLogs(ctx context.Context, sandbox, name string, opts ServiceLogsOptions) error {
	if err := c.serviceLogs(ctx, sandbox, name, opts); err != nil {
		return fmt.Errorf("reading logs of service %s of %s: %w", name, sandbox, err)
	}
	return nil
}

func (c *Client) serviceLogs(ctx context.Context, sandbox, name string, opts ServiceLogsOptions) error {
	sseg, err := segment("sandbox", sandbox)
	if err != nil {
		return err
	}
	nseg, err := segment("service", name)
	if err != nil {
		return err
	}
	q := api.AttachParams{Offset: opts.Offset, StderrOffset: opts.StderrOffset, NoFollow: !opts.Follow}.Query()
	u := wsURL(c.base) + "/v1/sandboxes/" + sseg + "/services/" + nseg + "/logs"
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	h := http.Header{}
	c.authorize(h)
	conn, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPClient: c.http, HTTPHeader: h})
	if err != nil {
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols && resp.Body != nil {
			return decodeError(resp)
		}
		return c.transportError(err)
	}
	defer conn.CloseNow()
	conn.SetReadLimit(execReadLimit)
	_, err = readStream(ctx, conn, streamIO{stdout: opts.Stdout, stderr: opts.Stderr, offset: opts.OnOffset})
	if err != nil && ctx.Err() == nil && websocket.CloseStatus(err) == websocket.StatusNormalClosure {
		// All that was buffered is written (or the service was deleted).
		return nil
	}
	if err != nil && opts.Follow && ctx.Err() != nil {
		return nil
	}
	return err
}
