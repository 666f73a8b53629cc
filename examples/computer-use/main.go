// Command computer-use is the loop a computer-use agent runs, through
// the Go SDK: look at the screen, act, look again. The "model" here is a
// fixed plan (click into the desktop's terminal, type a command, zoom in
// on the answer) so that the example runs without one; an agent puts its
// model's next action where plan is.
//
//	SANDGATE_URL=http://127.0.0.1:8080 SANDGATE_API_KEY=... go run ./examples/computer-use
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	sandgate "github.com/sandgate/sandgate/sdk/go"
)

func main() {
	if err := run(); err != nil {
		log.Fatal(err)
	}
}

// run does the work; its deferred deletes run even when it fails.
func run() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c, err := sandgate.FromEnv()
	if err != nil {
		return err
	}
	s, err := c.CreateSession(ctx, sandgate.SessionRequest{Kind: "desktop", TTLSeconds: 600, Labels: map[string]string{"example": "computer-use"}})
	if err != nil {
		return err
	}
	defer c.DeleteSession(context.WithoutCancel(ctx), s.ID)
	fmt.Printf("session %s (%s, %s start)\n", s.ID, s.Runtime, s.Start)

	// A person can watch the agent work.
	view, err := c.CreatePreview(ctx, s.ID, sandgate.PreviewRequest{Scope: "view", ViewOnly: true, TTLSeconds: 600})
	if err != nil {
		return err
	}
	fmt.Println("watch:", view.URL)

	// The desktop's terminal and editor show moments after the start.
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		// (Its text editor too; then the terminal is raised above it.)
		r, err := c.Run(ctx, s.ID, sandgate.ExecRequest{Cmd: []string{"sh", "-c",
			"xdotool search --onlyvisible --class mousepad >/dev/null && xdotool search --onlyvisible --class xterm windowraise"}})
		if err != nil {
			return err
		}
		if r.ExitCode == 0 {
			break
		}
		if time.Now().After(deadline) {
			return errors.New("the desktop's terminal never showed")
		}
	}
	out := os.Getenv("EXAMPLE_OUT")
	if out == "" {
		out = os.TempDir()
	}
	plan := []sandgate.Action{
		{Action: "screenshot"},
		{Action: "left_click", Coordinate: []int{200, 150}}, // the terminal's window
		{Action: "type", Text: "echo agent-was-here > /tmp/agent.txt; uname -sr"},
		{Action: "key", Text: "Return"},
		{Action: "wait", Duration: 1},
		{Action: "zoom", Region: []int{40, 40, 680, 360}},
	}
	for i, a := range plan {
		res, err := c.Act(ctx, s.ID, a)
		if err != nil {
			return fmt.Errorf("step %d %s: %v", i, a.Action, err)
		}
		fmt.Printf("step %d: %s in %s", i, a.Action, res.Took)
		if res.PNG != nil {
			f := filepath.Join(out, fmt.Sprintf("step-%d.png", i))
			if err := os.WriteFile(f, res.PNG, 0o644); err != nil {
				return err
			}
			fmt.Printf(", screen in %s (artifact %s)", f, res.Artifact.ID)
		}
		fmt.Println()
	}
	// What the agent typed ran in the session.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(300 * time.Millisecond) {
		r, err := c.Run(ctx, s.ID, sandgate.ExecRequest{Cmd: []string{"cat", "/tmp/agent.txt"}})
		if err != nil {
			return err
		}
		if r.ExitCode == 0 {
			fmt.Printf("the terminal wrote: %s", r.Stdout)
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the typed command never ran: %s", r.Stderr)
		}
	}
	arts, err := c.Artifacts(ctx, s.ID)
	if err != nil {
		return err
	}
	fmt.Printf("%d artifacts stored for reviewers\n", len(arts))
	return nil
}
