package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"github.com/coder/websocket"

	"loam.dev/loam/api"
)

// PutService defines (or redefines) a service and starts it (protocol 3).
// created says whether the service is new.
func (c *Client) PutService(ctx context.Context, def api.Service) (s *api.ServiceStatus, created bool, err error) {
	body, err := json.Marshal(def)
	if err != nil {
		return nil, false, fmt.Errorf("encoding service %s: %w", def.Name, err)
	}
	resp, err := c.do(ctx, http.MethodPut, "/services/"+url.PathEscape(def.Name), body)
	if err != nil {
		return nil, false, fmt.Errorf("defining service %s at %s: %w", def.Name, c.BaseURL, err)
	}
	defer resp.Body.Close()
	s = &api.ServiceStatus{}
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxSessionAnswer)).Decode(s); err != nil {
		return nil, false, fmt.Errorf("defining service %s at %s: reading the agent's answer: %w", def.Name, c.BaseURL, err)
	}
	return s, resp.StatusCode == http.StatusCreated, nil
}

// ListServices lists the agent's services.
func (c *Client) ListServices(ctx context.Context) ([]api.ServiceStatus, error) {
	var l api.ServiceList
	if err := c.call(ctx, http.MethodGet, "/services", nil, maxSessionListAnswer, &l); err != nil {
		return nil, fmt.Errorf("listing services at %s: %w", c.BaseURL, err)
	}
	return l.Services, nil
}

// GetService returns one service.
func (c *Client) GetService(ctx context.Context, name string) (*api.ServiceStatus, error) {
	var s api.ServiceStatus
	if err := c.call(ctx, http.MethodGet, "/services/"+url.PathEscape(name), nil, maxSessionAnswer, &s); err != nil {
		return nil, fmt.Errorf("getting service %s at %s: %w", name, c.BaseURL, err)
	}
	return &s, nil
}

// ServiceAction starts, stops or restarts a service (api.ServiceStart, …).
func (c *Client) ServiceAction(ctx context.Context, name, action string) (*api.ServiceStatus, error) {
	var s api.ServiceStatus
	if err := c.call(ctx, http.MethodPost, "/services/"+url.PathEscape(name)+"/"+url.PathEscape(action), nil, maxSessionAnswer, &s); err != nil {
		return nil, fmt.Errorf("%s service %s at %s: %w", action, name, c.BaseURL, err)
	}
	return &s, nil
}

// DeleteService stops a service and forgets it.
func (c *Client) DeleteService(ctx context.Context, name string) error {
	if err := c.call(ctx, http.MethodDelete, "/services/"+url.PathEscape(name), nil, 0, nil); err != nil {
		return fmt.Errorf("deleting service %s at %s: %w", name, c.BaseURL, err)
	}
	return nil
}

// DialServiceLogs opens a socket of a service's logs (see serveServiceLogs).
func (c *Client) DialServiceLogs(ctx context.Context, name string, p api.AttachParams) (*websocket.Conn, error) {
	return c.dial(ctx, withQuery("/services/"+url.PathEscape(name)+"/logs", p.Query()), "reading logs of service "+name)
}
