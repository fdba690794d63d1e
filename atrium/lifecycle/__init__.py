"""Instance lifecycle: the 14-state machine, runners that spawn app servers, hooks, warm pool."""
