package sandgate

import (
	"context"
	"net/url"
	"time"
)

// Profile is a browser profile kept for the tenant: sealed versions of a
// browser's state (cookies, local storage, IndexedDB, service workers).
type Profile struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
	// CurrentVersion is what a session starts with (0: a fresh profile).
	CurrentVersion int              `json:"current_version"`
	Versions       []ProfileVersion `json:"versions"`
	InUse          bool             `json:"in_use"`
}

// ProfileVersion is one saved state of a profile.
type ProfileVersion struct {
	Version     int       `json:"version"`
	Size        int64     `json:"size"`
	SHA256      string    `json:"sha256"`
	StoredBytes int64     `json:"stored_bytes"`
	Files       int       `json:"files"`
	CreatedAt   time.Time `json:"created_at"`
	Session     string    `json:"session"`
}

// CreateProfile makes an empty profile.
func (c *Client) CreateProfile(ctx context.Context, name string) (*Profile, error) {
	var p Profile
	if err := c.call(ctx, "POST", "/v1/profiles", map[string]string{"name": name}, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// Profiles lists the tenant's profiles.
func (c *Client) Profiles(ctx context.Context) ([]Profile, error) {
	var out struct {
		Profiles []Profile `json:"profiles"`
	}
	err := c.call(ctx, "GET", "/v1/profiles", nil, &out)
	return out.Profiles, err
}

// GetProfile returns one profile with its kept versions.
func (c *Client) GetProfile(ctx context.Context, id string) (*Profile, error) {
	var p Profile
	if err := c.call(ctx, "GET", "/v1/profiles/"+url.PathEscape(id), nil, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// DeleteProfile removes a profile and its versions.
func (c *Client) DeleteProfile(ctx context.Context, id string) error {
	return c.call(ctx, "DELETE", "/v1/profiles/"+url.PathEscape(id), nil, nil)
}

// RollbackProfile makes a kept version current (0: a fresh profile).
func (c *Client) RollbackProfile(ctx context.Context, id string, version int) (*Profile, error) {
	var p Profile
	if err := c.call(ctx, "POST", "/v1/profiles/"+url.PathEscape(id)+"/rollback", map[string]int{"version": version}, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// Snapshot is a saved workspace and home directory: files, never
// running processes.
type Snapshot struct {
	ID            string    `json:"id"`
	Session       string    `json:"session"`
	Size          int64     `json:"size"`
	SHA256        string    `json:"sha256"`
	CreatedAt     time.Time `json:"created_at"`
	Paths         []string  `json:"paths"`
	ProcessesKept bool      `json:"processes_kept"`
	Note          string    `json:"note"`
}

// CreateSnapshot saves the session's home and workspace; a new session
// starts from it with SessionRequest.Snapshot.
func (c *Client) CreateSnapshot(ctx context.Context, id string) (*Snapshot, error) {
	var s Snapshot
	if err := c.call(ctx, "POST", "/v1/sessions/"+url.PathEscape(id)+"/snapshots", nil, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// Snapshots lists the snapshots taken of a session.
func (c *Client) Snapshots(ctx context.Context, id string) ([]Snapshot, error) {
	var out struct {
		Snapshots []Snapshot `json:"snapshots"`
	}
	err := c.call(ctx, "GET", "/v1/sessions/"+url.PathEscape(id)+"/snapshots", nil, &out)
	return out.Snapshots, err
}
