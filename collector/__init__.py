"""Scrape targets, parse expositions, store samples."""
