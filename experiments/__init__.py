"""What sits on top of training: the ablation grid, its report and plots, and the command-line
error handler of the entry points. Nothing below imports this package."""
