"""Optional integrations: experiment trackers and TensorFlow, each importing its library only when used,
and reading a Ray Train checkpoint's files without the shared download directory's race, in
scratch directories that a killed worker does not leave behind for good."""
