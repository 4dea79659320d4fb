"""speechctl's own voice: a small DAC codec and a multi-stream speech LM trained on espeak-ng
speech (issue 20). See README.md beside this file."""
