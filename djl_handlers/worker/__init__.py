"""djl_handlers.worker"""
