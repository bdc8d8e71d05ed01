"""What a check tells people: terminal table, JSON, JUnit, HTML, pictures, progress."""
