// Command qa-login is a QA flow that logs in with a test account whose
// password the agent never reads. The operator stores the account in the
// vault (the secret goes in once and never comes back out) and binds it
// to the login site; the agent asks the gateway to fill the form, which
// types a placeholder that the egress proxy swaps for the password only
// on its way to that site.
//
//	QA_LOGIN_URL=https://app.example.com/login QA_USER=tester QA_PASSWORD=... \
//	SANDGATE_URL=... SANDGATE_API_KEY=... go run ./examples/qa-login
//
// The page must have #user, #pass and #submit (change the selectors for
// another form).
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"net/url"
	"os"
	"strconv"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/remote"

	sandgate "github.com/sandgate/sandgate/sdk/go"
)

func main() {
	if err := run(); err != nil {
		log.Fatal(err)
	}
}

// run does the work; its deferred deletes run even when it fails.
func run() error {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := sandgate.FromEnv()
	if err != nil {
		return err
	}
	login, err := url.Parse(os.Getenv("QA_LOGIN_URL"))
	if err != nil || login.Host == "" {
		return errors.New("QA_LOGIN_URL must be the login page's URL")
	}
	port := login.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[login.Scheme]
	}
	portN, _ := strconv.Atoi(port)

	// The operator's part: the account into the vault, with the one
	// place it may go. A session can bind it only there.
	cred, err := c.CreateCredential(ctx, sandgate.CredentialRequest{
		Name: "qa account", Kind: "form", Username: os.Getenv("QA_USER"), Secret: os.Getenv("QA_PASSWORD"),
		Destinations: []sandgate.Destination{{Scheme: login.Scheme, Host: login.Hostname(), Port: portN}},
	})
	if err != nil {
		return err
	}
	defer c.DeleteCredential(context.WithoutCancel(ctx), cred.ID)

	// The agent's part: a session that may reach the site, with the
	// account bound to the login page's origin and path.
	s, err := c.CreateSession(ctx, sandgate.SessionRequest{
		Kind: "browser", TTLSeconds: 300,
		Egress:      &sandgate.EgressRequest{Allow: []string{net.JoinHostPort(login.Hostname(), port)}},
		Credentials: []sandgate.Binding{{Credential: cred.ID, Scheme: login.Scheme, Host: login.Hostname(), Port: portN, PathPrefix: "/"}},
	})
	if err != nil {
		return err
	}
	defer c.DeleteSession(context.WithoutCancel(ctx), s.ID)
	p, err := c.CreatePreview(ctx, s.ID, sandgate.PreviewRequest{Scope: "cdp", TTLSeconds: 300})
	if err != nil {
		return err
	}
	ws, err := c.BrowserWebSocketURL(ctx, p)
	if err != nil {
		return err
	}
	// NoModifyURL: the endpoint as it is (see examples/chromedp).
	actx, cancelA := remote.NewAllocator(ctx, ws, remote.NoModifyURL)
	defer cancelA()
	bctx, cancelB := chromedp.NewContext(actx)
	defer cancelB()
	if err := chromedp.Do(bctx, chromedp.Navigate(login.String())); err != nil {
		return err
	}
	if err := c.FillCredential(ctx, s.ID, cred.ID, "#user", "username"); err != nil {
		return err
	}
	if err := c.FillCredential(ctx, s.ID, cred.ID, "#pass", "secret"); err != nil {
		return err
	}
	// All the agent can read from the page is the placeholder.
	typed, err := chromedp.Run(bctx, chromedp.Evaluate[string](`document.querySelector("#pass").value`))
	if err != nil {
		return err
	}
	fmt.Printf("the password field holds %d characters the agent can read, a placeholder: %t\n", len(typed), typed != os.Getenv("QA_PASSWORD"))
	if err := chromedp.Do(bctx, chromedp.Click(chromedp.CSS("#submit"))); err != nil {
		return err
	}
	title := ""
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if title, _ = chromedp.Run(bctx, chromedp.Title()); title != "" && title != "log in" {
			break
		}
	}
	fmt.Println("after logging in the page is:", title)
	return nil
}
