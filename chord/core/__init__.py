"""What every layer uses: the bad-input error, atomic file writes, quaternions, image and video
files."""
