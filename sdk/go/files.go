package sandgate

import (
	"context"
	"encoding/json"
	"io"
	"net/url"
)

// FileInfo is a file written into a session.
type FileInfo struct {
	Path   string `json:"path"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

// PutFile writes r to path in the session (its parent directories are
// made), streaming.
func (c *Client) PutFile(ctx context.Context, id, path string, r io.Reader) (*FileInfo, error) {
	resp, err := c.send(ctx, "PUT", "/v1/sessions/"+url.PathEscape(id)+"/files?path="+url.QueryEscape(path), r, "application/octet-stream")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var fi FileInfo
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxErrorBody)).Decode(&fi); err != nil {
		return nil, err
	}
	return &fi, nil
}

// GetFile opens a file of the session; a directory comes as a tar
// stream (content type application/x-tar). The caller closes it.
func (c *Client) GetFile(ctx context.Context, id, path string) (body io.ReadCloser, contentType string, err error) {
	resp, err := c.send(ctx, "GET", "/v1/sessions/"+url.PathEscape(id)+"/files?path="+url.QueryEscape(path), nil, "")
	if err != nil {
		return nil, "", err
	}
	return resp.Body, resp.Header.Get("Content-Type"), nil
}
