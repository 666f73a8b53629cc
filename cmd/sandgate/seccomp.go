package main

import (
	"os"

	"github.com/sandgate/sandgate/session"
)

// cmdSeccompProfile prints a runtime's session seccomp profile, which a
// cluster installs on its nodes as a Localhost profile.
func cmdSeccompProfile(args []string) error {
	if len(args) != 1 || (args[0] != "gvisor" && args[0] != "runc" && args[0] != "kata") {
		return usageError("usage: sandgate seccomp-profile gvisor|runc|kata")
	}
	raw, err := session.SeccompProfile(args[0])
	if err != nil {
		return err
	}
	_, err = os.Stdout.Write(append(raw, '\n'))
	return err
}
