package sandgate

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"
)

// Artifact is a stored screenshot, download, recording or audit log.
type Artifact struct {
	ID          string    `json:"id"`
	Session     string    `json:"session"`
	Kind        string    `json:"kind"`
	Name        string    `json:"name"`
	Size        int64     `json:"size"`
	SHA256      string    `json:"sha256"`
	ContentType string    `json:"content_type"`
	CreatedAt   time.Time `json:"created_at"`
	SourceURL   string    `json:"source_url,omitempty"`
}

// Artifacts lists a session's artifacts, also after it ended.
func (c *Client) Artifacts(ctx context.Context, id string) ([]Artifact, error) {
	var out struct {
		Artifacts []Artifact `json:"artifacts"`
	}
	err := c.call(ctx, "GET", "/v1/sessions/"+url.PathEscape(id)+"/artifacts", nil, &out)
	return out.Artifacts, err
}

// ArtifactURL returns the short-lived presigned URL an artifact is
// served from.
func (c *Client) ArtifactURL(ctx context.Context, artifactID string) (string, error) {
	resp, err := c.send(ctx, "GET", "/v1/artifacts/"+url.PathEscape(artifactID), nil, "")
	if err != nil {
		return "", err
	}
	resp.Body.Close()
	loc := resp.Header.Get("Location")
	if resp.StatusCode != http.StatusFound || loc == "" {
		return "", fmt.Errorf("artifact %s: %s without a location", artifactID, resp.Status)
	}
	return loc, nil
}

// OpenArtifact opens an artifact's content. The caller closes it.
func (c *Client) OpenArtifact(ctx context.Context, artifactID string) (io.ReadCloser, error) {
	loc, err := c.ArtifactURL(ctx, artifactID)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, "GET", loc, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		return nil, fmt.Errorf("artifact %s: %s", artifactID, resp.Status)
	}
	return resp.Body, nil
}

// Event is one record of a session's audit trail.
type Event struct {
	Time   time.Time      `json:"time"`
	Type   string         `json:"type"`
	Fields map[string]any `json:"fields,omitempty"`
}

// Events returns a session's audit trail; for a session the gateway no
// longer holds, the stored one.
func (c *Client) Events(ctx context.Context, id string) ([]Event, error) {
	var out struct {
		Events []Event `json:"events"`
	}
	err := c.call(ctx, "GET", "/v1/sessions/"+url.PathEscape(id)+"/events", nil, &out)
	return out.Events, err
}

// CredentialRequest stores a credential in the tenant's vault. Kind is
// basic, bearer, header, cookie or form. The secret is never returned.
type CredentialRequest struct {
	Name      string `json:"name"`
	Kind      string `json:"kind"`
	Username  string `json:"username,omitempty"`
	FieldName string `json:"field_name,omitempty"`
	Secret    string `json:"secret"`
	// Destinations are where the credential may go (1-16): a session
	// binds it only within one of them, else 403. They are sealed with
	// the secret and cannot be changed.
	Destinations []Destination `json:"destinations"`
	// AllowValueFill lets a binding use fill "value", which types the
	// secret itself into the page, where the agent can read it.
	AllowValueFill bool `json:"allow_value_fill,omitempty"`
}

// Destination is a place a credential may go; Port defaults from the
// scheme and PathPrefix to "/".
type Destination struct {
	Scheme     string `json:"scheme"`
	Host       string `json:"host"`
	Port       int    `json:"port,omitempty"`
	PathPrefix string `json:"path_prefix,omitempty"`
}

// Credential is a vault entry as the API shows it: without its secret.
type Credential struct {
	ID             string        `json:"id"`
	Name           string        `json:"name"`
	Kind           string        `json:"kind"`
	Username       string        `json:"username,omitempty"`
	FieldName      string        `json:"field_name,omitempty"`
	Destinations   []Destination `json:"destinations"`
	AllowValueFill bool          `json:"allow_value_fill,omitempty"`
	CreatedAt      time.Time     `json:"created_at"`
}

// CreateCredential stores a credential.
func (c *Client) CreateCredential(ctx context.Context, req CredentialRequest) (*Credential, error) {
	var m Credential
	if err := c.call(ctx, "POST", "/v1/credentials", req, &m); err != nil {
		return nil, err
	}
	return &m, nil
}

// Credentials lists the tenant's credentials.
func (c *Client) Credentials(ctx context.Context) ([]Credential, error) {
	var out struct {
		Credentials []Credential `json:"credentials"`
	}
	err := c.call(ctx, "GET", "/v1/credentials", nil, &out)
	return out.Credentials, err
}

// GetCredential returns one credential, without its secret.
func (c *Client) GetCredential(ctx context.Context, cid string) (*Credential, error) {
	var m Credential
	if err := c.call(ctx, "GET", "/v1/credentials/"+url.PathEscape(cid), nil, &m); err != nil {
		return nil, err
	}
	return &m, nil
}

// DeleteCredential removes a credential from the vault.
func (c *Client) DeleteCredential(ctx context.Context, cid string) error {
	return c.call(ctx, "DELETE", "/v1/credentials/"+url.PathEscape(cid), nil, nil)
}
