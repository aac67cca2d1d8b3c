package cli

import (
	"bufio"
	"errors"
	"fmt"
	"strings"
)

// errCancelled is returned when the user answers no to a confirmation.
var errCancelled = errors.New("cancelled")

// confirm asks whether to take a destructive action ("delete sandbox
// scratch") on the terminal first, GitHub CLI style: yes (from -y/--yes)
// skips the question, and without a terminal to ask on the action is
// refused rather than taken silently.
func (a *app) confirm(yes bool, action string) error {
	if yes {
		return nil
	}
	if !a.interactive() {
		return fmt.Errorf("cannot ask to confirm (not a terminal): pass --yes to %s", action)
	}
	fmt.Fprintf(a.stderr, "%s%s? [y/N] ", strings.ToUpper(action[:1]), action[1:])
	answer, err := bufio.NewReader(a.stdin).ReadString('\n')
	if err != nil && answer == "" {
		// EOF (Ctrl-D) is a no; end the prompt's line for the shell.
		fmt.Fprintln(a.stderr)
		return errCancelled
	}
	switch strings.ToLower(strings.TrimSpace(answer)) {
	case "y", "yes":
		return nil
	}
	return errCancelled
}
